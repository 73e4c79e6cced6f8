//! The writer thread and its group commit.
//!
//! With `synchronous=FULL`, every committed transaction costs an fsync of the write-ahead log,
//! and that fsync — not the SQL — is what limits the number of writes per second (measured:
//! some 6–7k claims/s with one transaction per claim, over 200k/s with 64 per transaction).
//! So one thread of our own owns the only write connection and shares each fsync among every
//! write that arrived while the previous one was running: it blocks for the first command,
//! drains whatever else is queued (up to `max_batch`), runs them all in one `BEGIN IMMEDIATE`
//! transaction, each inside its own savepoint, commits once, and only then answers every caller.
//! A caller therefore hears back only once its own write is durable, and a busy store batches
//! more the busier it gets.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use idemgate_core::store::Error;
use rusqlite::Connection;
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
    /// Runs the work and keeps its result until the batch commits. Returns whether the work
    /// succeeded, so that the writer knows whether to roll back its savepoint.
    fn execute(&mut self, conn: &Connection) -> bool;
    /// Answers the caller: the work's own result when the batch committed, else `failure`.
    fn answer(self: Box<Self>, failure: Option<&Error>);
}

struct Queued<T, W> {
    work: Option<W>,
    result: Option<Result<T, Error>>,
    reply: oneshot::Sender<Result<T, Error>>,
}

impl<T, W> Command for Queued<T, W>
where
    T: Send,
    W: FnOnce(&Connection) -> Result<T, Error> + Send,
{
    fn execute(&mut self, conn: &Connection) -> bool {
        let result = match self.work.take() {
            // A panic in one command is a bug, but it must not take the writer thread, and so
            // every later write, down with it: it becomes this command's error.
            Some(work) => catch_unwind(AssertUnwindSafe(|| work(conn))).unwrap_or_else(|_| {
                Err(Error::Unavailable("a SQLite store command panicked".into()))
            }),
            None => Err(Error::Unavailable(
                "a SQLite store command ran twice".into(),
            )),
        };
        let succeeded = result.is_ok();
        self.result = Some(result);
        succeeded
    }

    fn answer(self: Box<Self>, failure: Option<&Error>) {
        let answer = match (failure, self.result) {
            (Some(failure), _) => Err(failure.clone()),
            (None, Some(result)) => result,
            (None, None) => Err(Error::Unavailable(
                "a SQLite store command was never run".into(),
            )),
        };
        // The caller may have stopped waiting (its future was dropped); the write stands.
        let _ = self.reply.send(answer);
    }
}

type Batch = Vec<Box<dyn Command>>;

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

    /// Queues `work` and waits until the batch that carried it has committed.
    pub(crate) async fn submit<T, W>(&self, work: W) -> Result<T, Error>
    where
        T: Send + 'static,
        W: FnOnce(&Connection) -> Result<T, Error> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let command = Box::new(Queued {
            work: Some(work),
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
    if let Err(failure) = execute_all(conn, batch) {
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

/// Runs each command in its own savepoint, so that one failing command (a malformed row, say)
/// is undone alone while the others still commit.
fn execute_all(conn: &Connection, batch: &mut Batch) -> Result<(), Error> {
    let broken = |e: rusqlite::Error| classify("running a write batch", &e);
    for command in batch.iter_mut() {
        conn.execute_batch("SAVEPOINT command").map_err(broken)?;
        if command.execute(conn) {
            conn.execute_batch("RELEASE command").map_err(broken)?;
        } else {
            if conn.is_autocommit() {
                // Some errors (a full disk, an I/O error) make SQLite abandon the whole
                // transaction, taking the earlier commands' writes with it.
                return Err(Error::Unavailable(
                    "SQLite rolled back the write transaction after a failed command".into(),
                ));
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
