//! `idemgate migrate --store URL`: applies the store's migrations and reports the schema
//! version; a second run is a no-op that reports the same version; bad URLs are refused by
//! name. PostgreSQL runs on a throwaway database (`DATABASE_URL`; skipped loudly without one,
//! unless `IDEMGATE_REQUIRE_POSTGRES=1`).

mod support;

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
