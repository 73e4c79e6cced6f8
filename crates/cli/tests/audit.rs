//! `idemgate audit`: a key pair from keygen, a store's log exported and verified, and an edited,
//! cut or foreign-key export refused with the entry named and exit status 1.

use std::path::Path;
use std::process::{Command, Output};

use idemgate_conformance::audit_suite::{self, denial};
use idemgate_conformance::store_suite::{awaiting, record};
use idemgate_core::store::{Cas, Claimed, Store};
use idemgate_store_sqlite::{Options, SqliteStore};

fn idemgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(args)
        .env_remove("IDEMGATE_STORE")
        .output()
        .expect("the binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A store file with `n` denials in its log, signed with the suite's key.
async fn store_with_denials(path: &Path, n: usize) {
    let store = SqliteStore::open(path, Options::default())
        .unwrap()
        .with_sealer(audit_suite::sealer());
    for i in 0..n {
        let r = record(&format!("acme:prod:wf:s{i}"), awaiting(90_000));
        let Ok(Claimed::Inserted(r)) = store.claim(r, Vec::new()).await else {
            panic!("claim");
        };
        assert!(matches!(
            store
                .transition(denial(&r, "alice", 2_000 + i as i64))
                .await,
            Ok(Cas::Done(_))
        ));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_then_verify_and_every_damage_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("gate.sqlite");
    store_with_denials(&db, 5).await;
    let url = format!("sqlite://{}", db.display());
    let out = dir.path().join("audit.jsonl");
    let public = audit_suite::public_key().to_string();

    let export = idemgate(&[
        "audit",
        "export",
        "--store",
        &url,
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(export.status.success(), "{}", text(&export.stderr));
    assert!(
        text(&export.stderr).contains("exported 5 audit entries")
            && text(&export.stderr).contains("the last is entry 5"),
        "{}",
        text(&export.stderr)
    );
    let lines: Vec<String> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(lines.len(), 5);

    let verify = |file: &Path, extra: &[&str]| {
        let mut args = vec![
            "audit",
            "verify",
            file.to_str().unwrap(),
            "--public-key",
            &public,
        ];
        args.extend_from_slice(extra);
        idemgate(&args)
    };
    let clean = verify(&out, &["--expect-last", "5"]);
    assert!(clean.status.success(), "{}", text(&clean.stderr));
    assert!(
        text(&clean.stdout).contains("5 entries verified"),
        "{}",
        text(&clean.stdout)
    );

    let write = |name: &str, lines: &[String]| {
        let path = dir.path().join(name);
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        path
    };
    let refused = |path: &Path, extra: &[&str], words: &str| {
        let o = verify(path, extra);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
        assert!(
            text(&o.stderr).contains(words),
            "{words:?} in {}",
            text(&o.stderr)
        );
    };

    // A changed reason in entry 2.
    let mut edited = lines.clone();
    edited[1] = edited[1].replace("not this customer", "a better story");
    refused(
        &write("edited.jsonl", &edited),
        &[],
        "entry 2 (line 2): hash does not match",
    );
    // Entries 3 and 4 swapped.
    let mut swapped = lines.clone();
    swapped.swap(2, 3);
    refused(
        &write("swapped.jsonl", &swapped),
        &[],
        "entry 4 (line 3): entry 3 is missing",
    );
    // Entry 3 removed.
    let mut removed = lines.clone();
    removed.remove(2);
    refused(
        &write("removed.jsonl", &removed),
        &[],
        "entry 4 (line 3): entry 3 is missing",
    );
    // The tail cut: valid by itself, refused against the number export reported.
    let cut = write("cut.jsonl", &lines[..3]);
    assert!(verify(&cut, &[]).status.success());
    refused(
        &cut,
        &["--expect-last", "5"],
        "the log ends at entry 3, but entry 5 was expected",
    );
    // Another key.
    let keygen = idemgate(&["audit", "keygen", "--json"]);
    assert!(keygen.status.success());
    let pair: serde_json::Value = serde_json::from_slice(&keygen.stdout).unwrap();
    let other = pair["public_key"].as_str().unwrap();
    assert_eq!(other.len(), 64);
    assert_eq!(pair["secret_key"].as_str().unwrap().len(), 64);
    let o = idemgate(&[
        "audit",
        "verify",
        out.to_str().unwrap(),
        "--public-key",
        other,
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("entry 1 (line 1): signed by another key"),
        "{}",
        text(&o.stderr)
    );
    // A malformed key is an error of the command, not a verdict.
    let o = idemgate(&[
        "audit",
        "verify",
        out.to_str().unwrap(),
        "--public-key",
        "abc",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("--public-key must be 64 hex digits"),
        "{}",
        text(&o.stderr)
    );
}
