//! Real crashes: a worker process is killed with SIGKILL right after its claim, or right after
//! the downstream committed, and a restarted process must end at applied, replayed or unknown —
//! never a second effect. Effects are counted in the downstream's own ledger file, which the
//! executor never writes.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use idemgate_conformance::ledger::LedgerDownstream;
use serde_json::Value;

struct Place {
    _dir: tempfile::TempDir,
    store: String,
    ledger: PathBuf,
}

fn place() -> Place {
    let dir = tempfile::tempdir().unwrap();
    Place {
        store: format!("sqlite://{}", dir.path().join("idemgate.sqlite").display()),
        ledger: dir.path().join("ledger.sqlite"),
        _dir: dir,
    }
}

fn worker(p: &Place, receipt: &str, extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_idemgate-conformance"));
    cmd.args(["worker", "--store", &p.store, "--ledger"])
        .arg(&p.ledger)
        .args(["--receipt", receipt])
        .args(extra);
    cmd
}

/// Starts a worker that pauses at `point` and waits until it says so.
fn paused(p: &Place, receipt: &str, step: &str, point: &str) -> Child {
    let mut child = worker(p, receipt, &["--step", step, "--pause-after", point])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the worker");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let expected = format!("PAUSED {point}");
    loop {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) if line == expected => return child,
            Ok(_) => continue,
            Err(e) => {
                let _ = child.kill();
                panic!("the worker never paused at {point}: {e}");
            }
        }
    }
}

/// SIGKILL: the process gets no chance to finish, release or record anything.
fn kill(mut child: Child) {
    child.kill().expect("SIGKILL the worker");
    let status = child.wait().unwrap();
    assert!(!status.success(), "the worker was killed, not finished");
}

/// Runs a worker to completion and returns the outcome it printed.
fn deliver(p: &Place, receipt: &str, step: &str, offset_ms: i64) -> Value {
    let out = worker(
        p,
        receipt,
        &["--step", step, "--clock-offset-ms", &offset_ms.to_string()],
    )
    .output()
    .expect("run the worker");
    assert!(
        out.status.success(),
        "worker failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(text.lines().last().expect("an outcome line")).unwrap()
}

fn effects(ledger: &Path, step: &str) -> u64 {
    let key = format!("acme:test:run_827:{step}");
    LedgerDownstream::effects_by_key(ledger)
        .unwrap()
        .into_iter()
        .find(|(k, _)| *k == key)
        .map(|(_, n)| n)
        .unwrap_or(0)
}

/// Past the default 30-second lease.
const LATER: i64 = 31_000;

#[test]
fn sigkill_after_claim_then_restart_executes_once() {
    let p = place();
    kill(paused(&p, "dedup", "s1", "claim"));
    assert_eq!(effects(&p.ledger, "s1"), 0, "killed before the effect");
    // The dead worker's lease is still live: a retry waits instead of guessing.
    let early = deliver(&p, "dedup", "s1", 0);
    assert_eq!(early["status"], "in_flight", "{early}");
    assert_eq!(effects(&p.ledger, "s1"), 0);
    // After the lease: the downstream deduplicates on the key, so the claim took no dispatch
    // marker and recovery executes under the same key.
    let later = deliver(&p, "dedup", "s1", LATER);
    assert_eq!(later["status"], "applied", "{later}");
    assert_eq!(effects(&p.ledger, "s1"), 1);
    assert_eq!(deliver(&p, "dedup", "s1", LATER)["status"], "replayed");
    assert_eq!(effects(&p.ledger, "s1"), 1);
}

#[test]
fn sigkill_after_a_marked_claim_then_restart_ends_unknown_never_sent() {
    // A downstream that does not deduplicate: its claim is written with the dispatch marker in
    // it, so a worker killed right after it may, for all a later one can tell, have sent.
    let p = place();
    kill(paused(&p, "lookup", "s1", "claim"));
    assert_eq!(effects(&p.ledger, "s1"), 0, "killed before the effect");
    let later = deliver(&p, "lookup", "s1", LATER);
    assert_eq!(later["status"], "unknown", "{later}");
    assert_eq!(later["next_action"], "reconcile");
    assert_eq!(effects(&p.ledger, "s1"), 0, "never sent blindly");
    assert_eq!(deliver(&p, "lookup", "s1", LATER)["status"], "unknown");
    assert_eq!(effects(&p.ledger, "s1"), 0);
}

#[test]
fn sigkill_after_downstream_commit_then_restart_replays_the_receipt() {
    for receipt in ["lookup", "dedup"] {
        let p = place();
        kill(paused(&p, receipt, "s1", "commit"));
        assert_eq!(
            effects(&p.ledger, "s1"),
            1,
            "{receipt}: the effect happened before the kill"
        );
        let later = deliver(&p, receipt, "s1", LATER);
        assert_eq!(later["status"], "replayed", "{receipt}: {later}");
        assert_eq!(effects(&p.ledger, "s1"), 1, "{receipt}: no second effect");
    }
}

#[test]
fn sigkill_after_downstream_commit_without_receipt_path_ends_unknown() {
    let p = place();
    kill(paused(&p, "none", "s1", "commit"));
    let later = deliver(&p, "none", "s1", LATER);
    assert_eq!(later["status"], "unknown", "{later}");
    assert_eq!(later["next_action"], "reconcile");
    assert_eq!(effects(&p.ledger, "s1"), 1, "unknown, and still one effect");
    assert_eq!(deliver(&p, "none", "s1", LATER)["status"], "unknown");
    assert_eq!(effects(&p.ledger, "s1"), 1);
}

#[test]
fn recoverer_finishes_what_killed_workers_left() {
    let p = place();
    kill(paused(&p, "dedup", "a", "claim"));
    kill(paused(&p, "dedup", "b", "commit"));
    let out = worker(
        &p,
        "dedup",
        &["--recover", "--clock-offset-ms", &LATER.to_string()],
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value =
        serde_json::from_str(String::from_utf8(out.stdout).unwrap().trim()).unwrap();
    assert_eq!(report["recovered"], 2, "{report}");
    assert_eq!(deliver(&p, "dedup", "a", LATER)["status"], "replayed");
    assert_eq!(deliver(&p, "dedup", "b", LATER)["status"], "replayed");
    assert_eq!((effects(&p.ledger, "a"), effects(&p.ledger, "b")), (1, 1));
}
