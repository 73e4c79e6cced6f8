//! `idemgate migrate --store URL`: applies the store's migrations and reports the schema
//! version; a second run is a no-op that reports the same version; bad URLs are refused by
//! name. PostgreSQL runs on a throwaway database (`DATABASE_URL`; skipped loudly without one,
//! unless `IDEMGATE_REQUIRE_POSTGRES=1`). A SQLite store's rebuild of its operations table
//! (schema version 10), killed halfway, leaves the file as it was and runs again.

mod support;

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use idemgate_store_postgres::testing::fresh_database;
use support::idemgate;

fn migrate(args: &[&str]) -> support::Run {
    let mut all = vec!["migrate"];
    all.extend(args);
    idemgate(None, None, &all)
}

#[test]
fn sqlite_migrates_once_and_reports_the_version() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gate.sqlite");
    let url = format!("sqlite://{}", path.display());
    let version = idemgate_store_sqlite::SCHEMA_VERSION;

    let first = migrate(&["--store", &url, "--json"]);
    assert_eq!(first.code, 0, "{first:?}");
    assert_eq!(
        first.json(),
        serde_json::json!({
            "store": url, "from_version": 0, "schema_version": version, "applied": version,
        })
    );
    let store = idemgate_store_sqlite::SqliteStore::open(&path, Default::default()).unwrap();
    assert_eq!(store.schema_version().unwrap(), version);
    drop(store);

    let second = migrate(&["--store", &url]);
    assert_eq!(second.code, 0, "{second:?}");
    assert_eq!(
        second.stdout.trim(),
        format!("{url}: schema version {version}, already up to date (nothing applied)")
    );
    let third = migrate(&["--store", &url, "--json"]);
    assert_eq!(third.json()["applied"], 0, "{third:?}");
    assert_eq!(third.json()["schema_version"], version);

    let other = dir.path().join("other.sqlite");
    let text = migrate(&["--store", &format!("sqlite://{}", other.display())]);
    assert_eq!(text.code, 0, "{text:?}");
    assert!(
        text.stdout.contains(&format!(
            "schema version {version} (applied {version} migrations: 1 to {version})"
        )),
        "{text:?}"
    );
}

#[test]
fn bad_stores_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.sqlite");
    std::fs::write(&garbage, vec![b'x'; 4096]).unwrap();
    let missing_dir = dir.path().join("no/such/dir/gate.sqlite");
    for (url, says) in [
        (
            "mysql://db/x".to_string(),
            "must start with sqlite:// or postgres://",
        ),
        ("sqlite://".to_string(), "names no file"),
        (format!("sqlite://{}", garbage.display()), "not a database"),
        (
            format!("sqlite://{}", missing_dir.display()),
            "unable to open",
        ),
        (
            "postgres://app:s3cret@127.0.0.1:1/idemgate".to_string(),
            "postgres://app:***@127.0.0.1:1/idemgate",
        ),
    ] {
        let run = migrate(&["--store", &url]);
        assert_eq!(run.code, 2, "{url}: {run:?}");
        assert!(run.stderr.contains(says), "{url}: {run:?}");
        assert!(
            !run.stderr.contains("s3cret"),
            "a password never shows: {run:?}"
        );
    }
    assert_eq!(
        std::fs::read(&garbage).unwrap(),
        vec![b'x'; 4096],
        "a file that is not a database is left alone"
    );
    let none = migrate(&[]);
    assert_eq!(none.code, 2, "{none:?}");
    assert!(none.stderr.contains("--store"), "{none:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_migrates_once_and_reports_the_version() {
    let Some(db) = fresh_database().await else {
        return;
    };
    let version = idemgate_store_postgres::migrate::SCHEMA_VERSION;
    let url = db.url().to_string();
    let first = tokio::task::spawn_blocking({
        let url = url.clone();
        move || migrate(&["--store", &url, "--json"])
    })
    .await
    .unwrap();
    assert_eq!(first.code, 0, "{first:?}");
    let report = first.json();
    assert_eq!(report["from_version"], 0, "{report}");
    assert_eq!(report["schema_version"], version, "{report}");
    assert_eq!(report["applied"], version, "{report}");

    let second = tokio::task::spawn_blocking({
        let url = url.clone();
        move || migrate(&["--store", &url])
    })
    .await
    .unwrap();
    assert_eq!(second.code, 0, "{second:?}");
    assert!(
        second.stdout.contains(&format!(
            "schema version {version}, already up to date (nothing applied)"
        )),
        "{second:?}"
    );
    // The database is at that version for the store itself.
    let store = db.store().await;
    assert_eq!(store.schema_version().await.unwrap(), version);
}

/// What a SQLite file holds: its schema version, its records, whether `operations` is still a
/// `WITHOUT ROWID` table, and SQLite's own check of every index against the table.
fn sqlite_state(path: &std::path::Path) -> (i64, i64, bool, String) {
    let conn = rusqlite::Connection::open(path).unwrap();
    let version = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    let records = conn
        .query_row("SELECT count(*) FROM operations", [], |r| r.get(0))
        .unwrap();
    let without_rowid: i64 = conn
        .query_row(
            "SELECT wr FROM pragma_table_list WHERE name = 'operations'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let check = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    (version, records, without_rowid == 1, check)
}

#[test]
fn a_sqlite_rebuild_killed_halfway_leaves_the_file_as_it_was_and_runs_again() {
    // A store as schema version 9 left it, large enough that the rebuild of version 10 takes a
    // while: 200,000 settled records of some 500 bytes.
    const RECORDS: i64 = 200_000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gate.sqlite");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        idemgate_store_sqlite::migrate_to_version_for_tests(&conn, 9).unwrap();
        conn.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1) \
             INSERT INTO operations (tenant, key, tool, tool_version, fingerprint, \
             canonicalization, status, fence, dispatch, effect_reference, result, actor, \
             created_at, updated_at, expires_at, purge_at, trace) \
             SELECT 'acme', printf('acme:prod:wf-%08x%08x:step', abs(random()) % 4294967296, i), \
             'tickets.create', '1', 'sha256:' || lower(hex(randomblob(32))), 1, 'applied', 1, \
             'sent', 'ticket-' || i, json_object('id', i, 'url', lower(hex(randomblob(60)))), \
             'agent', i, i, 9000000000000 + i, 9100000000000 + i, \
             '[\"claimed\",1,1,\"w1\",null]' || char(10) || '[\"committed\",2,1,\"w1\",null]' \
             || char(10) FROM n",
            [RECORDS],
        )
        .unwrap();
    }
    assert_eq!(sqlite_state(&path), (9, RECORDS, true, "ok".into()));
    let url = format!("sqlite://{}", path.display());

    // The rebuild under way, shown by its log growing past the first few megabytes of the
    // copy (the whole copy writes over a hundred), then a real SIGKILL.
    let mut child = Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(["migrate", "--store", &url])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let log = dir.path().join("gate.sqlite-wal");
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::metadata(&log).map_or(0, |m| m.len()) < 8 << 20 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the migration ended before it could be killed halfway"
        );
        assert!(Instant::now() < deadline, "the rebuild never got going");
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");

    // As it was: version 9, every record, the old table.
    assert_eq!(sqlite_state(&path), (9, RECORDS, true, "ok".into()));

    // And the step again, to the end.
    let again = migrate(&["--store", &url, "--json"]);
    assert_eq!(again.code, 0, "{again:?}");
    let report = again.json();
    assert_eq!(report["from_version"], 9, "{report}");
    assert_eq!(report["applied"], 1, "{report}");
    assert_eq!(
        sqlite_state(&path),
        (
            idemgate_store_sqlite::SCHEMA_VERSION,
            RECORDS,
            false,
            "ok".into()
        )
    );
}
