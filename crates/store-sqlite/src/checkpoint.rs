//! Checkpoints of the write-ahead log, off the writer's path.
//!
//! In WAL mode a commit appends the pages it changed to the log, and a checkpoint copies them
//! back into the database file and fsyncs it. SQLite runs that checkpoint itself, inside the
//! commit that takes the log past 1000 pages: on the writer thread, before the callers of that
//! batch hear back and before the next batch may start. On a large file, where each new key
//! lands on a page of its own and every page the checkpoint copies is a write of its own, that
//! was half of the writer thread's time (docs/benchmarks/history.md, "Cost as the store grows").
//!
//! So the write connection's own checkpoint is turned off and replaced. Its WAL hook, which
//! SQLite calls after each commit with the log's length, wakes a thread of ours — with a
//! connection of its own — once [`BACKGROUND_AT`] pages have been appended since the last
//! checkpoint, and that thread runs a *passive* checkpoint, which never waits for the writer
//! or a reader and never makes them wait.
//!
//! A passive checkpoint cannot rewind the log: SQLite starts writing the log from its beginning
//! again only when a write transaction begins with every page of it copied, and under load the
//! writer appends more while the thread copies. So the write connection runs a passive
//! checkpoint between batches (its callers answered: after a lone caller's own write, on a
//! blocking thread) once the log is [`REWIND_AT`] pages long and nearly
//! all of it copied — little is left then — after which its next transaction rewinds the log.
//! Should the thread fall behind, the writer does the same at [`REWIND_ANYWAY_AT`] pages
//! whatever is left, as SQLite's own checkpoint would have: the log stays bounded.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender};
use std::thread::JoinHandle;

use idemgate_core::store::Error;
use rusqlite::Connection;
use rusqlite::wal::CheckpointMode;

/// Pages appended since the last checkpoint that wake the checkpoint thread: SQLite's own
/// automatic checkpoint threshold.
pub(crate) const BACKGROUND_AT: u64 = 1000;

/// The log's length from which the writer rewinds it, once the thread has copied nearly all of
/// it (at most [`REWIND_LEFT`] pages left).
pub(crate) const REWIND_AT: u64 = 4 * BACKGROUND_AT;

/// What may be left to copy for the writer to rewind the log at [`REWIND_AT`].
const REWIND_LEFT: u64 = 256;

/// The log's length from which the writer rewinds it whatever is left to copy.
pub(crate) const REWIND_ANYWAY_AT: u64 = 2 * REWIND_AT;

/// The log as the writer's commits and the checkpoints last saw it.
#[derive(Default)]
pub(crate) struct Log {
    /// Pages in the log after the last commit of this process's writer.
    pages: AtomicU64,
    /// Pages of the log copied into the database file, by the last checkpoint that ran.
    copied: AtomicU64,
    /// Checkpoints run by the thread, and by the writer to rewind the log.
    background: AtomicU64,
    rewinds: AtomicU64,
}

impl Log {
    /// A commit left the log `pages` long. `true` when the thread should checkpoint.
    fn committed(&self, pages: u64) -> bool {
        let before = self.pages.swap(pages, Ordering::Relaxed);
        if pages < before {
            // Rewound since the last commit: nothing of the new log is copied yet.
            self.copied.store(0, Ordering::Relaxed);
        }
        let copied = self.copied.load(Ordering::Relaxed).min(pages);
        pages - copied >= BACKGROUND_AT
    }

    /// Whether the writer should checkpoint now so that its next transaction rewinds the log.
    pub(crate) fn should_rewind(&self) -> bool {
        let pages = self.pages.load(Ordering::Relaxed);
        let left = pages.saturating_sub(self.copied.load(Ordering::Relaxed));
        (pages >= REWIND_AT && left <= REWIND_LEFT) || pages >= REWIND_ANYWAY_AT
    }

    /// Whether the log has reached [`REWIND_ANYWAY_AT`] pages: a lone caller rewinds it before
    /// its own write rather than leave it to a task that has not run.
    pub(crate) fn overdue(&self) -> bool {
        self.pages.load(Ordering::Relaxed) >= REWIND_ANYWAY_AT
    }

    fn checkpointed(&self, result: rusqlite::Result<(i32, i32)>) {
        // A busy checkpointer lock (another process's checkpoint) or a reader on an old
        // snapshot only means less was copied; the next checkpoint does the rest.
        if let Ok((_, copied)) = result
            && let Ok(copied) = u64::try_from(copied)
        {
            self.copied.store(copied, Ordering::Relaxed);
        }
    }

    /// Checkpoints run so far: by the thread, and by the writer to rewind the log.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            self.background.load(Ordering::Relaxed),
            self.rewinds.load(Ordering::Relaxed),
        )
    }
}

/// Runs a passive checkpoint on the write connection between batches, so that its next
/// transaction rewinds the log ([`Log::should_rewind`] says when; see the module documentation).
pub(crate) fn rewind(log: &Log, conn: &Connection) {
    log.checkpointed(conn.wal_checkpoint_v2(Some(rusqlite::MAIN_DB), CheckpointMode::PASSIVE));
    log.rewinds.fetch_add(1, Ordering::Relaxed);
}

/// The checkpoint thread. Dropping it stops the thread and closes its connection.
pub(crate) struct Checkpointer {
    wake: SyncSender<()>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Starts the thread on `conn` (a connection of its own to the file) and hands checkpoints
    /// over to it from `writer`, the write connection: SQLite's automatic checkpoint is
    /// replaced by a hook that counts the log's pages and wakes the thread.
    pub(crate) fn spawn(
        writer: &mut Connection,
        conn: Connection,
        log: Arc<Log>,
    ) -> Result<Checkpointer, Error> {
        // One pending wake is enough: the thread checkpoints everything appended until it runs.
        let (wake, woken) = mpsc::sync_channel::<()>(1);
        let stop = Arc::new(AtomicBool::new(false));
        let (hook_log, hook_wake) = (Arc::clone(&log), wake.clone());
        // The hook replaces the automatic checkpoint (`wal_autocheckpoint` is a hook too). It
        // must answer OK: an error would make the commit that called it report a failure,
        // though it committed.
        writer
            .wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, pages: i32| {
                if hook_log.committed(u64::try_from(pages).unwrap_or(0)) {
                    // Full: a wake is pending already. Disconnected: the store is closing.
                    let _ = hook_wake.try_send(());
                }
                Ok(())
            }))
            .map_err(|e| Error::Unavailable(format!("handing checkpoints to a thread: {e}")))?;
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("idemgate-sqlite-checkpoint".into())
            .spawn(move || {
                while woken.recv().is_ok() && !stopping.load(Ordering::Relaxed) {
                    log.checkpointed(
                        conn.wal_checkpoint_v2(Some(rusqlite::MAIN_DB), CheckpointMode::PASSIVE),
                    );
                    log.background.fetch_add(1, Ordering::Relaxed);
                }
            })
            .map_err(|e| {
                Error::Unavailable(format!("starting the SQLite checkpoint thread: {e}"))
            })?;
        Ok(Checkpointer {
            wake,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        // The hook holds a sender too, until the write connection closes after this: the
        // thread is told to stop rather than waiting for the channel to close. A wake already
        // pending wakes it just as well.
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.wake.try_send(());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use idemgate_conformance::store_suite::{pending, record};
    use idemgate_core::store::Store;
    use serde_json::json;

    use super::{BACKGROUND_AT, REWIND_ANYWAY_AT};
    use crate::{Options, SqliteStore, Synchronous};

    /// Under a stream of writes, from concurrent callers and from one at a time, the log is
    /// checkpointed by the thread and rewound by the writer, so it never grows past
    /// [`REWIND_ANYWAY_AT`] pages (and a batch), and every write is there after a reopen.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_log_is_checkpointed_by_its_thread_and_rewound_by_the_writer() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("idemgate.db");
        let options = Options {
            synchronous: Synchronous::Off,
            ..Options::default()
        };
        let store = Arc::new(SqliteStore::open(&path, options.clone()).expect("open"));
        // Rows of some 6 kB: each claim appends a few pages (its leaf, two overflow pages, the
        // recoverer's index), so some 3 * REWIND_ANYWAY_AT pages are written in all.
        let body = "x".repeat(6_000);
        let claim = |store: Arc<SqliteStore>, key: String, body: String| async move {
            let mut r = record(&key, pending("w1", 31_000));
            r.request = Some(json!({ "title": key, "body": body }));
            store.claim(r, Vec::new()).await.expect("claim");
        };
        let (tasks, each) = (8, 500);
        let mut running = Vec::new();
        for t in 0..tasks {
            let (store, body) = (Arc::clone(&store), body.clone());
            running.push(tokio::spawn(async move {
                for i in 0..each {
                    claim(
                        Arc::clone(&store),
                        format!("acme:prod:wf-{t}:s{i:04}"),
                        body.clone(),
                    )
                    .await;
                }
            }));
        }
        for task in running {
            task.await.expect("a claimer");
        }
        for i in 0..2_000 {
            claim(
                Arc::clone(&store),
                format!("acme:prod:wf-lone:s{i:04}"),
                body.clone(),
            )
            .await;
        }
        let stats = store.stats();
        assert!(
            stats.checkpoints >= 3 * REWIND_ANYWAY_AT / BACKGROUND_AT / 2,
            "the thread checkpoints: {stats:?}"
        );
        assert!(stats.rewinds >= 1, "the writer rewinds the log: {stats:?}");
        // A frame is a page and a 24-byte header; the header of the log is 32 bytes.
        let wal = std::fs::metadata(dir.path().join("idemgate.db-wal"))
            .expect("the log")
            .len();
        let frames = wal.saturating_sub(32) / (4096 + 24);
        assert!(
            frames <= REWIND_ANYWAY_AT + 512,
            "the log grew to {frames} pages: {stats:?}"
        );
        drop(store);
        let store = SqliteStore::open(&path, options).expect("reopen");
        for key in ["acme:prod:wf-7:s0499", "acme:prod:wf-lone:s1999"] {
            let key = idemgate_conformance::store_suite::key(key);
            assert!(store.get(&key).await.expect("get").is_some(), "{key:?}");
        }
    }
}
