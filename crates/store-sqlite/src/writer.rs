//! The writer thread and its group commit.
//!
//! With `synchronous=FULL`, every committed transaction costs an fsync of the write-ahead log,
//! and that fsync — not the SQL — is what limits the number of writes per second (measured:
//! some 6–7k claims/s with one transaction per claim, over 200k/s with 64 per transaction).
//! So one thread of our own owns the only write connection and shares each fsync among every
//! write that arrived while the previous one was running: it blocks for the first command,
//! drains whatever else is queued (up to `max_batch`), runs them all in one `BEGIN IMMEDIATE`
//! transaction, commits once, and only then answers every caller. A caller therefore hears back
//! only once its own write is durable, and a busy store batches more the busier it gets.
//!
//! Each command must be all or nothing even though it shares a transaction: a command that
//! fails after some of its statements wrote must not commit those writes beside the others'.
//! Savepoints give that, at a price paid by every command (measured: some 15 µs of the writer
//! thread per operation, against a failure that practically never happens). So a batch runs
//! first without them, and the writer counts the rows each command changed; only when a
//! command fails *after having changed rows* is the transaction rolled back and the batch run
//! again with a savepoint around each command. A command is therefore a function that can run
//! twice: it holds its inputs and only reads them.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use idemgate_core::store::Error;
use rusqlite::{CachedStatement, Connection};
use tokio::sync::oneshot;

use crate::error::{classify, commit_may_have_landed};

/// Counters of the writer's work, for tests and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Transactions committed.
    pub commits: u64,
    /// Commands carried by those transactions (failed commands included: they answered an
    /// error, but shared the commit).
    pub commands: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    commits: AtomicU64,
    commands: AtomicU64,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> Stats {
        Stats {
            commits: self.commits.load(Ordering::Relaxed),
            commands: self.commands.load(Ordering::Relaxed),
        }
    }
}

/// One queued write: its work, run by the writer inside the batch's transaction, and the
/// caller waiting for the answer.
trait Command: Send {
    /// Runs the work and keeps its result until the batch commits, replacing the result of an
    /// earlier run of a batch that was rolled back. Returns whether the work succeeded.
    fn execute(&mut self, tx: &mut Tx<'_>) -> bool;
    /// Answers the caller: the work's own result when the batch committed, else `failure`.
    fn answer(self: Box<Self>, failure: Option<&Error>);
}

struct Queued<T, W> {
    work: W,
    result: Option<Result<T, Error>>,
    reply: oneshot::Sender<Result<T, Error>>,
}

impl<T, W> Command for Queued<T, W>
where
    T: Send,
    W: Fn(&mut Tx<'_>) -> Result<T, Error> + Send,
{
    fn execute(&mut self, tx: &mut Tx<'_>) -> bool {
        // A panic in one command is a bug, but it must not take the writer thread, and so every
        // later write, down with it: it becomes this command's error.
        let result = catch_unwind(AssertUnwindSafe(|| (self.work)(tx)))
            .unwrap_or_else(|_| Err(Error::Unavailable("a SQLite store command panicked".into())));
        let succeeded = result.is_ok();
        self.result = Some(result);
        succeeded
    }

    fn answer(self: Box<Self>, failure: Option<&Error>) {
        let Queued {
            work,
            result,
            reply,
        } = *self;
        // The work goes before the caller hears back, so that what it shares with the caller
        // is the caller's alone again when it wakes.
        drop(work);
        let answer = match (failure, result) {
            (Some(failure), _) => Err(failure.clone()),
            (None, Some(result)) => result,
            (None, None) => Err(Error::Unavailable(
                "a SQLite store command was never run".into(),
            )),
        };
        // The caller may have stopped waiting (its future was dropped); the write stands.
        let _ = reply.send(answer);
    }
}

type Batch = Vec<Box<dyn Command>>;

/// What a command runs with: the write connection inside the batch's transaction, and the
/// statements the batch has taken from the connection's cache so far. A statement goes back to
/// the cache once per batch rather than once per use: taking one out and putting it back hashes
/// its text twice and clears its bindings, and the writer thread did that some three times per
/// operation.
pub(crate) struct Tx<'c> {
    pub(crate) conn: &'c Connection,
    statements: Vec<(String, CachedStatement<'c>)>,
}

impl<'c> Tx<'c> {
    fn new(conn: &'c Connection) -> Tx<'c> {
        Tx {
            conn,
            statements: Vec::new(),
        }
    }

    /// The prepared statement for `sql`, prepared (or taken from the cache) on first use in
    /// this batch. A statement is reset after every use, so it is ready again.
    pub(crate) fn statement(&mut self, sql: &str) -> rusqlite::Result<&mut CachedStatement<'c>> {
        let found = self.statements.iter().position(|(text, _)| text == sql);
        let index = match found {
            Some(index) => index,
            None => {
                let statement = self.conn.prepare_cached(sql)?;
                self.statements.push((sql.to_owned(), statement));
                self.statements.len() - 1
            }
        };
        Ok(&mut self.statements[index].1)
    }
}

/// The handle callers hold: a queue into the writer thread.
pub(crate) struct Writer {
    queue: Option<mpsc::Sender<Box<dyn Command>>>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    pub(crate) fn spawn(
        conn: Connection,
        max_batch: usize,
        counters: Arc<Counters>,
    ) -> Result<Writer, Error> {
        let (queue, commands) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("idemgate-sqlite-writer".into())
            .spawn(move || run(conn, commands, max_batch.max(1), &counters))
            .map_err(|e| Error::Unavailable(format!("starting the SQLite writer thread: {e}")))?;
        Ok(Writer {
            queue: Some(queue),
            thread: Some(thread),
        })
    }

    /// Queues `work` and waits until the batch that carried it has committed. `work` may run
    /// twice (see the module documentation): only its last run's result is answered.
    pub(crate) async fn submit<T, W>(&self, work: W) -> Result<T, Error>
    where
        T: Send + 'static,
        W: Fn(&mut Tx<'_>) -> Result<T, Error> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let command = Box::new(Queued {
            work,
            result: None,
            reply,
        });
        let queue = self
            .queue
            .as_ref()
            .ok_or_else(|| Error::Unavailable("the SQLite store is closing".into()))?;
        queue
            .send(command)
            .map_err(|_| Error::Unavailable("the SQLite writer thread has stopped".into()))?;
        // A command is only dropped unanswered if the writer thread died mid-batch, before or
        // after its commit: the caller cannot know which.
        answer.await.map_err(|_| {
            Error::Ambiguous("the SQLite writer thread stopped before answering".into())
        })?
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Closing the queue ends the writer's loop once it has answered what is queued; joining
        // closes the write connection before the store is gone, so that a reopen of the same
        // file (or a test's temporary directory removal) never races it.
        self.queue.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(
    conn: Connection,
    commands: mpsc::Receiver<Box<dyn Command>>,
    max_batch: usize,
    counters: &Counters,
) {
    let mut batch: Batch = Vec::with_capacity(max_batch);
    // How many commands the previous batch held: the size of the wave of concurrent callers.
    let mut wave = 1;
    // Blocks until someone writes; ends when every handle has been dropped.
    while let Ok(first) = commands.recv() {
        batch.push(first);
        while batch.len() < max_batch {
            match commands.try_recv() {
                Ok(command) => batch.push(command),
                Err(_) => break,
            }
        }
        // Concurrent callers arrive in waves (all claim, all wait for the commit, all
        // finalise). When the last batch was larger than this one has grown so far, the rest of
        // the wave is usually a few microseconds away, and the fsync about to be paid costs far
        // more: wait for it, briefly and boundedly. A lone caller (a wave of one) never waits.
        if batch.len() < wave.min(max_batch) {
            let deadline = Instant::now() + LINGER;
            while batch.len() < wave.min(max_batch) {
                let left = deadline.saturating_duration_since(Instant::now());
                match commands.recv_timeout(left) {
                    Ok(command) => batch.push(command),
                    Err(_) => break,
                }
            }
        }
        wave = batch.len();
        commit(&conn, &mut batch, counters);
    }
    // Closing: refresh the planner's statistics where they are stale, as SQLite recommends
    // before a long-lived connection closes. A failure only leaves older statistics.
    let _ = conn.execute_batch("PRAGMA optimize");
}

/// The longest a batch waits for the rest of a wave of concurrent callers: a fraction of one
/// fsync, so the wait can only be repaid by sharing that fsync.
const LINGER: Duration = Duration::from_micros(250);

/// Runs one batch in one transaction and answers every command in it.
fn commit(conn: &Connection, batch: &mut Batch, counters: &Counters) {
    // IMMEDIATE takes the write lock up front. Another process holding it makes us wait here,
    // under busy_timeout, rather than fail half way through the batch with an SQLITE_BUSY that
    // a deferred transaction could not recover from.
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        let failure = classify("starting a write transaction", &e);
        answer_all(batch, Some(&failure));
        return;
    }
    let executed = execute(&mut Tx::new(conn), batch);
    if let Err(failure) = executed {
        // The transaction is broken (SQLite rolled it back itself, or a savepoint statement
        // failed): nothing in it will commit, so every command fails, even those that had
        // succeeded.
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        answer_all(batch, Some(&failure));
        return;
    }
    match conn.execute_batch("COMMIT") {
        Ok(()) => {
            counters.commits.fetch_add(1, Ordering::Relaxed);
            counters
                .commands
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
            answer_all(batch, None);
        }
        Err(e) => {
            let failure = if commit_may_have_landed(&e) {
                Error::Ambiguous(format!("committing a write transaction: {e}"))
            } else if conn.is_autocommit() || conn.execute_batch("ROLLBACK").is_ok() {
                // SQLite rolled the transaction back, or we did: nothing was written.
                Error::Unavailable(format!("committing a write transaction: {e}"))
            } else {
                Error::Ambiguous(format!(
                    "committing a write transaction failed and could not be rolled back: {e}"
                ))
            };
            answer_all(batch, Some(&failure));
        }
    }
}

/// Runs the batch inside the open transaction so that exactly the successful commands' writes
/// are in it. An `Err` means the transaction is broken and nothing in it may commit.
fn execute(tx: &mut Tx<'_>, batch: &mut Batch) -> Result<(), Error> {
    let broken = |e: rusqlite::Error| classify("running a write batch", &e);
    let conn = tx.conn;
    for command in batch.iter_mut() {
        let before = conn.total_changes();
        if command.execute(tx) {
            continue;
        }
        if conn.is_autocommit() {
            return Err(rolled_back());
        }
        if conn.total_changes() != before {
            // This command failed after some of its statements wrote (a failed statement is
            // undone by SQLite itself; the ones before it are not). Start over, with each
            // command in a savepoint, so that those writes go and the others' stay.
            conn.execute_batch("ROLLBACK; BEGIN IMMEDIATE")
                .map_err(broken)?;
            return execute_in_savepoints(tx, batch);
        }
    }
    Ok(())
}

fn rolled_back() -> Error {
    // Some errors (a full disk, an I/O error) make SQLite abandon the whole transaction, taking
    // the earlier commands' writes with it.
    Error::Unavailable("SQLite rolled back the write transaction after a failed command".into())
}

/// Runs each command in its own savepoint, so that one failing command (a malformed row, say)
/// is undone alone while the others still commit.
fn execute_in_savepoints(tx: &mut Tx<'_>, batch: &mut Batch) -> Result<(), Error> {
    let broken = |e: rusqlite::Error| classify("running a write batch", &e);
    let conn = tx.conn;
    for command in batch.iter_mut() {
        conn.execute_batch("SAVEPOINT command").map_err(broken)?;
        if command.execute(tx) {
            conn.execute_batch("RELEASE command").map_err(broken)?;
        } else {
            if conn.is_autocommit() {
                return Err(rolled_back());
            }
            conn.execute_batch("ROLLBACK TO command; RELEASE command")
                .map_err(broken)?;
        }
    }
    Ok(())
}

fn answer_all(batch: &mut Batch, failure: Option<&Error>) {
    for command in batch.drain(..) {
        command.answer(failure);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, mpsc};

    use idemgate_core::store::Error;
    use rusqlite::Connection;

    use super::{Counters, Tx, Writer};

    type Work = Arc<dyn Fn(&mut Tx<'_>) -> Result<(), Error> + Send + Sync>;

    fn writer(dir: &tempfile::TempDir) -> (Writer, Arc<Counters>) {
        let conn = Connection::open(dir.path().join("w.sqlite")).expect("a database");
        conn.execute_batch("CREATE TABLE t (name TEXT PRIMARY KEY)")
            .expect("a table");
        let counters = Arc::new(Counters::default());
        let writer = Writer::spawn(conn, 64, Arc::clone(&counters)).expect("a writer");
        (writer, counters)
    }

    fn names(dir: &tempfile::TempDir) -> Vec<String> {
        let conn = Connection::open(dir.path().join("w.sqlite")).expect("a database");
        let mut stmt = conn.prepare("SELECT name FROM t ORDER BY name").unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    }

    fn insert(conn: &Connection, name: &str) -> Result<(), Error> {
        conn.execute("INSERT INTO t (name) VALUES (?1)", [name])
            .map(drop)
            .map_err(|e| Error::Unavailable(e.to_string()))
    }

    /// Runs `commands` in one batch: a first command holds the writer, alone in its own batch,
    /// until all of them are queued behind it. Returns each command's answer and how often
    /// each ran.
    async fn one_batch(
        writer: &Writer,
        commands: Vec<Work>,
    ) -> (Vec<Result<(), Error>>, Vec<usize>) {
        let (started, running) = mpsc::channel::<()>();
        let (release, hold) = mpsc::channel::<()>();
        let hold = std::sync::Mutex::new(hold);
        let mut holding = Box::pin(writer.submit(move |_| {
            let _ = started.send(());
            // Returns at once once `release` is gone, should this ever run again.
            let _ = hold.lock().unwrap().recv();
            Ok(())
        }));
        assert!(poll_once(holding.as_mut()).is_pending());
        running.recv().expect("the writer runs the holding command");
        let runs: Vec<Arc<AtomicUsize>> = commands.iter().map(|_| Arc::default()).collect();
        let mut pending: Vec<_> = commands
            .into_iter()
            .zip(&runs)
            .map(|(command, runs)| {
                let runs = Arc::clone(runs);
                Box::pin(writer.submit(move |tx| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    command(tx)
                }))
            })
            .collect();
        for p in &mut pending {
            // The first poll queues the command behind the holding one.
            assert!(poll_once(p.as_mut()).is_pending());
        }
        release.send(()).unwrap();
        drop(release);
        holding.await.expect("the holding command commits");
        let mut answers = Vec::new();
        for p in pending {
            answers.push(p.await);
        }
        let runs = runs.iter().map(|r| r.load(Ordering::SeqCst)).collect();
        (answers, runs)
    }

    /// Polls a future once without a waker that matters: enough to run `submit` up to its
    /// first await, which queues the command.
    fn poll_once<F: std::future::Future + ?Sized>(
        f: std::pin::Pin<&mut F>,
    ) -> std::task::Poll<F::Output> {
        let waker = std::task::Waker::noop();
        f.poll(&mut std::task::Context::from_waker(waker))
    }

    #[tokio::test]
    async fn a_command_that_fails_after_writing_leaves_no_write_and_the_others_commit() {
        let dir = tempfile::tempdir().unwrap();
        let (writer, counters) = writer(&dir);
        let (answers, runs) = one_batch(
            &writer,
            vec![
                Arc::new(|tx: &mut Tx<'_>| insert(tx.conn, "a")),
                Arc::new(|tx: &mut Tx<'_>| {
                    insert(tx.conn, "b")?;
                    Err(Error::Unavailable("failed after its write".into()))
                }),
                Arc::new(|tx: &mut Tx<'_>| insert(tx.conn, "c")),
            ],
        )
        .await;
        assert!(answers[0].is_ok(), "{answers:?}");
        assert_eq!(
            answers[1],
            Err(Error::Unavailable("failed after its write".into()))
        );
        assert!(answers[2].is_ok(), "{answers:?}");
        // The batch was started over with savepoints when the second command failed: the
        // commands up to it ran twice, the third once; the failed one's write is gone while the
        // others' stand.
        assert_eq!(runs, vec![2, 2, 1]);
        assert_eq!(names(&dir), vec!["a", "c"]);
        drop(writer);
        // The holding command's batch and the redone batch: two commits, four commands.
        let stats = counters.snapshot();
        assert_eq!((stats.commits, stats.commands), (2, 4));
    }

    #[tokio::test]
    async fn a_command_that_fails_before_writing_costs_no_redo() {
        let dir = tempfile::tempdir().unwrap();
        let (writer, _) = writer(&dir);
        let (answers, runs) = one_batch(
            &writer,
            vec![
                Arc::new(|tx: &mut Tx<'_>| insert(tx.conn, "a")),
                // A failing statement is undone by SQLite itself: nothing of it stays.
                Arc::new(|tx: &mut Tx<'_>| insert(tx.conn, "a")),
                Arc::new(|tx: &mut Tx<'_>| insert(tx.conn, "c")),
            ],
        )
        .await;
        assert!(answers[0].is_ok() && answers[2].is_ok(), "{answers:?}");
        assert!(answers[1].is_err(), "{answers:?}");
        assert_eq!(runs, vec![1, 1, 1]);
        assert_eq!(names(&dir), vec!["a", "c"]);
    }
}
