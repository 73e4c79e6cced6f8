//! Records, events and transitions for the store tests, built from a few words each.

#![allow(dead_code)] // Each test binary uses a different part of this module.

use std::process::Command;

use idemgate_core::ErrorCode;
use idemgate_core::fingerprint::Fingerprint;
use idemgate_core::key::OperationKey;
use idemgate_core::record::{
    Digest, Dispatch, Event, EventKind, Evidence, Lease, Millis, Receipt, Record, RecordState,
    Refusal,
};
use idemgate_core::store::{Expect, RequestUpdate, Transition};
use serde_json::json;

/// A fresh database, or return from the test after the helper printed why it was skipped.
#[macro_export]
macro_rules! database {
    () => {
        match idemgate_store_postgres::testing::fresh_database().await {
            Some(db) => db,
            None => return,
        }
    };
}

/// A plain connection of the test's own, beside the store's: to hold locks, kill sessions and
/// count rows.
pub async fn admin(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// Opens a transaction on `client` that holds the row lock of `key` until it ends, so that a
/// store statement updating that row waits.
pub async fn lock_row<'c>(
    client: &'c mut tokio_postgres::Client,
    key: &str,
) -> tokio_postgres::Transaction<'c> {
    let tx = client.transaction().await.unwrap();
    tx.execute(
        "SELECT 1 FROM operations WHERE key = $1 FOR UPDATE",
        &[&key],
    )
    .await
    .unwrap();
    tx
}

pub const LEASE: Millis = 30_000;

pub fn key(text: &str) -> OperationKey {
    OperationKey::parse(text).unwrap()
}

/// A distinct, valid fingerprint per number.
pub fn fingerprint(n: u64) -> Fingerprint {
    Fingerprint::parse(&format!("sha256:{n:064x}")).unwrap()
}

/// A record freshly claimed by `owner` at `now`, with fence 1.
pub fn claimed(key_text: &str, owner: &str, now: Millis) -> Record {
    Record {
        key: key(key_text),
        tool: "create_ticket".into(),
        tool_version: "1".into(),
        fingerprint: fingerprint(1),
        canonicalization: 1,
        state: pending(Some(owner), now + LEASE, Dispatch::NotSent),
        fence: 1,
        actor: "agent-1".into(),
        request: Some(json!({"title": "Printer on fire", "priority": 2})),
        approved_by: None,
        created_at: now,
        updated_at: now,
        expires_at: now + 86_400_000,
        purge_at: now + 2 * 86_400_000,
        intent_window: true,
    }
}

pub fn pending(owner: Option<&str>, expires_at: Millis, dispatch: Dispatch) -> RecordState {
    RecordState::Pending {
        lease: Lease {
            owner: owner.map(str::to_string),
            expires_at,
        },
        dispatch,
    }
}

pub fn applied(reference: &str) -> RecordState {
    RecordState::Applied(Receipt {
        reference: reference.into(),
        result: json!({"ticket": reference, "note": "ünïcödé ✓"}),
    })
}

pub fn refused() -> RecordState {
    RecordState::FailedPermanent(Refusal {
        code: ErrorCode::DownstreamRejected,
        message: "quota exceeded".into(),
    })
}

pub fn unknown() -> RecordState {
    RecordState::Unknown(Evidence {
        reason: "timeout after send".into(),
        reference: None,
        job_id: None,
    })
}

/// A tombstone of what a record settled as: an effect's reference, else a refusal's code,
/// else nothing that ever ran.
pub fn tombstone(reference: Option<&str>, refusal: Option<ErrorCode>) -> RecordState {
    RecordState::Tombstone(match (reference, refusal) {
        (Some(reference), _) => Digest::Applied {
            reference: reference.into(),
        },
        (None, Some(code)) => Digest::Refused { code },
        (None, None) => Digest::NeverRan,
    })
}

pub fn event(kind: EventKind, at: Millis, attempt: u64, worker: &str) -> Event {
    Event::new(kind, at, attempt, worker)
}

/// The owner's own next step from `current`: same fence, expecting the current status.
pub fn step(current: &Record, next: RecordState, now: Millis, events: Vec<Event>) -> Transition {
    Transition {
        key: current.key.clone(),
        expect: Expect {
            fence: current.fence,
            status: current.status(),
            created_at: current.created_at,
            lease_expired_by: None,
            dispatch: None,
        },
        next,
        fence: current.fence,
        request: RequestUpdate::Keep,
        approved_by: None,
        fingerprint: None,
        expiry: None,
        events,
        now,
        webhook: None,
        audit: None,
    }
}

/// A takeover of `current` by `worker` at `now`: the lease must have expired by `now`, and the
/// fence grows by one.
pub fn takeover(current: &Record, worker: &str, now: Millis) -> Transition {
    let fence = current.fence + 1;
    Transition {
        key: current.key.clone(),
        expect: Expect {
            fence: current.fence,
            status: current.status(),
            created_at: current.created_at,
            lease_expired_by: Some(now),
            dispatch: None,
        },
        next: pending(Some(worker), now + LEASE, Dispatch::NotSent),
        fence,
        request: RequestUpdate::Keep,
        approved_by: None,
        fingerprint: None,
        expiry: None,
        events: vec![event(EventKind::Recovered, now, fence, worker)],
        now,
        webhook: None,
        audit: None,
    }
}

// ---------------------------------------------------------------------------------------------
// Stopping and starting the local cluster, for the restart tests.

/// The cluster the restart tests control: `IDEMGATE_PG_CLUSTER` (default `15 main`).
fn cluster() -> (String, String) {
    let text = std::env::var("IDEMGATE_PG_CLUSTER").unwrap_or_else(|_| "15 main".into());
    let mut parts = text.split_whitespace();
    (
        parts.next().unwrap_or("15").into(),
        parts.next().unwrap_or("main").into(),
    )
}

/// Runs `pg_ctlcluster <action>` on that cluster; true when it succeeded.
pub fn pg_ctl(action: &str) -> bool {
    let (version, name) = cluster();
    let status = Command::new("pg_ctlcluster")
        .args(["--skip-systemctl-redirect", &version, &name, action])
        .status();
    matches!(status, Ok(s) if s.success())
}

pub fn is_running() -> bool {
    let (version, name) = cluster();
    Command::new("pg_ctlcluster")
        .args(["--skip-systemctl-redirect", &version, &name, "status"])
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Starts the server again however the test ends, so that a failure here does not leave every
/// later test on the machine without a database.
pub struct ServerBack;

impl Drop for ServerBack {
    fn drop(&mut self) {
        if !is_running() && !pg_ctl("start") {
            eprintln!("could not start PostgreSQL again: run pg_ctlcluster start by hand");
        }
    }
}
