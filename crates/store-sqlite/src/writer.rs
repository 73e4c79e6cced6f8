//! The writer thread and its group commit.
//!
//! With `synchronous=FULL`, every committed transaction costs an fsync of the write-ahead log,
//! and that fsync — not the SQL — is what limits the number of writes per second (measured:
//! some 6–7k claims/s with one transaction per claim, over 200k/s with 64 per transaction).
//! So one thread of our own owns the only write connection and shares each fsync among every
//! write that arrived while the previous one was running: it blocks for the first command,
//! opens a `BEGIN IMMEDIATE` transaction and runs it, runs in the same transaction whatever
//! else is queued or arrives while the wave of concurrent callers lasts (up to `max_batch`),
//! commits once, and only then answers every caller. A caller therefore hears back
//! only once its own write is durable, and a busy store batches more the busier it gets.
//!
//! A batch of writes that all came from an event loop (Node's, which polls the engine's futures
//! itself: `store::never_wait_on_this_thread`) does not wait for the rest of a wave: that
//! loop's callers write one after another as it runs each caller's JavaScript, so the writer
//! commits what has come, and the loop's next writes gather during that commit's fsync.
//!
//! A caller alone has nobody to share an fsync with, and the hand-off to the writer thread and
//! the answer back were a fifth of its operation: while the last batch held one command and
//! nothing waits for the writer thread, a caller takes the write connection itself (it sits
//! behind a mutex, which the writer thread holds only for a batch) and commits its own write
//! the same way, on its own thread — never on an event loop's, which must not wait for an fsync.
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
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use idemgate_core::store::Error;
use rusqlite::{CachedStatement, Connection};
use tokio::sync::oneshot;

use crate::checkpoint::{self, Log};
use crate::error::{classify, commit_may_have_landed};

/// Counters of the writer's work, for tests and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Transactions committed.
    pub commits: u64,
    /// Commands carried by those transactions (failed commands included: they answered an
    /// error, but shared the commit).
    pub commands: u64,
    /// The longest any write transaction held the write lock, from taking it (`BEGIN IMMEDIATE`) to
    /// the end of its `COMMIT` or rollback: the longest a claim may have waited behind another write.
    pub longest_hold: Duration,
    /// The longest any write transaction ran its commands, from taking the lock to sending
    /// `COMMIT`: `longest_hold` without the commit's own write-ahead-log writes and fsync
    /// (and the checkpoint a commit may run), which the disk decides.
    pub longest_work: Duration,
    /// Checkpoints of the write-ahead log run by the checkpoint thread.
    pub checkpoints: u64,
    /// Checkpoints the writer ran between batches so that the log could start over.
    pub rewinds: u64,
}

#[derive(Default)]
struct Counters {
    commits: AtomicU64,
    commands: AtomicU64,
    longest_hold_nanos: AtomicU64,
    longest_work_nanos: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> Stats {
        Stats {
            commits: self.commits.load(Ordering::Relaxed),
            commands: self.commands.load(Ordering::Relaxed),
            longest_hold: Duration::from_nanos(self.longest_hold_nanos.load(Ordering::Relaxed)),
            longest_work: Duration::from_nanos(self.longest_work_nanos.load(Ordering::Relaxed)),
            ..Stats::default()
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
    /// Whether the caller is an event loop (`store::never_wait_on_this_thread`), whose other
    /// callers' writes come one poll apart rather than microseconds apart.
    fn by_event_loop(&self) -> bool;
}

struct Queued<T, W> {
    work: W,
    result: Option<Result<T, Error>>,
    reply: oneshot::Sender<Result<T, Error>>,
    by_event_loop: bool,
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
            by_event_loop: _,
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

    fn by_event_loop(&self) -> bool {
        self.by_event_loop
    }
}

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
    shared: Arc<Shared>,
}

/// What the writer thread shares with callers.
struct Shared {
    /// The write connection: the writer thread holds it for a batch, a lone caller may hold it
    /// for its own write (see [`Writer::submit`]).
    conn: Mutex<Connection>,
    /// How many commands the last batch held: 1 while callers come one at a time.
    wave: AtomicUsize,
    /// Commands handed to the writer thread and not yet answered.
    queued: AtomicUsize,
    counters: Counters,
    max_batch: usize,
    /// The write-ahead log's length and what the checkpoints copied of it: the writer rewinds
    /// the log between batches when it is due (`checkpoint`).
    log: Arc<Log>,
    /// The longest a batch waits for the rest of a wave ([`LINGER`]).
    linger: Duration,
}

impl Writer {
    pub(crate) fn spawn(
        conn: Connection,
        max_batch: usize,
        log: Arc<Log>,
    ) -> Result<Writer, Error> {
        Writer::spawn_lingering(conn, max_batch, log, LINGER)
    }

    fn spawn_lingering(
        conn: Connection,
        max_batch: usize,
        log: Arc<Log>,
        linger: Duration,
    ) -> Result<Writer, Error> {
        let shared = Arc::new(Shared {
            conn: Mutex::new(conn),
            wave: AtomicUsize::new(1),
            queued: AtomicUsize::new(0),
            counters: Counters::default(),
            max_batch: max_batch.max(1),
            log,
            linger,
        });
        let (queue, commands) = mpsc::channel();
        let writing = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("idemgate-sqlite-writer".into())
            .spawn(move || run(&writing, commands))
            .map_err(|e| Error::Unavailable(format!("starting the SQLite writer thread: {e}")))?;
        Ok(Writer {
            queue: Some(queue),
            thread: Some(thread),
            shared,
        })
    }

    /// Queues `work` and waits until the batch that carried it has committed. `work` may run
    /// twice (see the module documentation): only its last run's result is answered.
    pub(crate) async fn submit<T, W>(&self, work: W) -> Result<T, Error>
    where
        T: Send + 'static,
        W: Fn(&mut Tx<'_>) -> Result<T, Error> + Send + 'static,
    {
        let (reply, mut answer) = oneshot::channel();
        let command = Box::new(Queued {
            work,
            result: None,
            reply,
            by_event_loop: !idemgate_core::store::may_wait_on_this_thread(),
        });
        let queue = self
            .queue
            .as_ref()
            .ok_or_else(|| Error::Unavailable("the SQLite store is closing".into()))?;
        // A caller alone commits its own write on its own thread: there is nobody to share the
        // fsync with, and handing the write to the writer thread and the answer back costs two
        // thread wake-ups, a fifth of a lone operation. Only where the runtime lets a task
        // block (`block_in_place`).
        if may_block()
            && let Some(conn) = self.shared.alone()
        {
            let finished = tokio::task::block_in_place(|| {
                // The rewind handed to a blocking thread below has not run yet, and the log is
                // as long as it may get (a starved machine: the checkpoint thread and that
                // task both behind): rewind it here, before this write, so that the log stays
                // bounded however the threads are scheduled.
                if self.shared.log.overdue() {
                    checkpoint::rewind(&self.shared.log, &conn);
                }
                let mut batch = Open::begin(&conn, 1);
                batch.add(command);
                batch.finish(&self.shared)
            });
            drop(conn);
            finished.answer();
            if self.shared.log.should_rewind() {
                // Between writes, as on the writer thread, but not on this caller's path: it
                // is answered now, and writes that come meanwhile find the connection taken
                // and go to the writer thread.
                let shared = Arc::clone(&self.shared);
                tokio::task::spawn_blocking(move || shared.rewind_log());
            }
            return answer.try_recv().map_err(|_| {
                Error::Ambiguous("a SQLite store command was dropped unanswered".into())
            })?;
        }
        self.shared.queued.fetch_add(1, Ordering::Relaxed);
        if queue.send(command).is_err() {
            self.shared.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(Error::Unavailable(
                "the SQLite writer thread has stopped".into(),
            ));
        }
        // A command is only dropped unanswered if the writer thread died mid-batch, before or
        // after its commit: the caller cannot know which.
        answer.await.map_err(|_| {
            Error::Ambiguous("the SQLite writer thread stopped before answering".into())
        })?
    }

    /// What the writer has done so far, the checkpoints of its log included.
    pub(crate) fn stats(&self) -> Stats {
        let (checkpoints, rewinds) = self.shared.log.counts();
        Stats {
            checkpoints,
            rewinds,
            ..self.shared.counters.snapshot()
        }
    }

    /// The write connection, when callers come one at a time and nothing is being written.
    /// For point reads only: while it is held, writes wait.
    pub(crate) fn idle_connection(&self) -> Option<MutexGuard<'_, Connection>> {
        self.shared.alone()
    }
}

impl Shared {
    /// The write connection, when the caller asking is alone: the last batch held one command,
    /// the writer thread has nothing queued or running (so nobody waiting is overtaken), and
    /// no other caller holds the connection.
    fn alone(&self) -> Option<MutexGuard<'_, Connection>> {
        if self.wave.load(Ordering::Relaxed) != 1 || self.queued.load(Ordering::Relaxed) != 0 {
            return None;
        }
        self.conn.try_lock().ok()
    }

    /// Rewinds the write-ahead log between batches; the caller checked that it is due
    /// (`checkpoint`).
    fn rewind_log(&self) {
        let conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        checkpoint::rewind(&self.log, &conn);
    }
}

/// Whether this task may block its thread: on a multi-threaded tokio runtime, through
/// `block_in_place`, which first moves the thread's other tasks elsewhere, and never on a
/// thread that must not wait (Node's event loop, `store::never_wait_on_this_thread`).
fn may_block() -> bool {
    idemgate_core::store::may_wait_on_this_thread()
        && tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Closing the queue ends the writer's loop once it has answered what is queued; after
        // the join, the last share of the write connection is this handle's, which closes it
        // before the store is gone, so that a reopen of the same file (or a test's temporary
        // directory removal) never races it.
        self.queue.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(shared: &Shared, commands: mpsc::Receiver<Box<dyn Command>>) {
    let max_batch = shared.max_batch;
    // Blocks until someone writes; ends when every handle has been dropped.
    while let Ok(first) = commands.recv() {
        let deadline = Instant::now() + shared.linger;
        let conn = shared.conn.lock().unwrap_or_else(PoisonError::into_inner);
        // How many commands the previous batch held: the size of the wave of concurrent
        // callers.
        let wave = shared.wave.load(Ordering::Relaxed);
        let mut batch = Open::begin(&conn, max_batch);
        // Whether the rest of a wave is worth waiting for: not when every write so far came
        // from an event loop. Its callers' writes come one after another as the loop runs each
        // caller's JavaScript; the writer waiting for the last of them would only idle while the
        // loop, its work done, waits for the commit — the two threads taking turns. Committed
        // as they come, the loop's next writes gather during this commit's fsync instead.
        let mut patient = !first.by_event_loop();
        batch.add(first);
        // Each command runs as soon as it is taken, so the writer works while the rest of the
        // batch is still arriving rather than waiting for it and then working.
        while batch.len() < max_batch && !batch.is_broken() {
            match commands.try_recv() {
                Ok(command) => {
                    patient |= !command.by_event_loop();
                    batch.add(command);
                    continue;
                }
                Err(mpsc::TryRecvError::Empty) => {}
                Err(mpsc::TryRecvError::Disconnected) => break,
            }
            // Concurrent callers arrive in waves (all claim, all wait for the commit, all
            // finalise). While this batch is smaller than the last one, the rest of the wave
            // is usually a few microseconds away, and the fsync about to be paid costs far
            // more: wait for it, briefly and boundedly. A lone caller (a wave of one) never
            // waits.
            if batch.len() >= wave || !patient {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match commands.recv_timeout(left) {
                Ok(command) => {
                    patient |= !command.by_event_loop();
                    batch.add(command);
                }
                Err(_) => break,
            }
        }
        let taken = batch.len();
        shared.wave.store(taken, Ordering::Relaxed);
        let finished = batch.finish(shared);
        drop(conn);
        shared.queued.fetch_sub(taken, Ordering::Relaxed);
        finished.answer();
        if shared.log.should_rewind() {
            shared.rewind_log();
        }
    }
    // Closing: refresh the planner's statistics where they are stale, as SQLite recommends
    // before a long-lived connection closes. A failure only leaves older statistics.
    let conn = shared.conn.lock().unwrap_or_else(PoisonError::into_inner);
    let _ = conn.execute_batch("PRAGMA optimize");
}

/// The longest a batch waits for the rest of a wave of concurrent callers: a fraction of one
/// fsync, so the wait can only be repaid by sharing that fsync.
const LINGER: Duration = Duration::from_micros(250);

/// One write transaction, filled with commands as they arrive and committed once.
struct Open<'c> {
    tx: Tx<'c>,
    /// When `BEGIN IMMEDIATE` was sent.
    began: Instant,
    commands: Vec<Box<dyn Command>>,
    /// Each command runs in a savepoint of its own: set once a command failed after writing.
    savepoints: bool,
    /// Why the transaction cannot commit, once it cannot: every command then fails.
    broken: Option<Error>,
}

impl<'c> Open<'c> {
    fn begin(conn: &'c Connection, max_batch: usize) -> Open<'c> {
        // IMMEDIATE takes the write lock up front. Another process holding it makes us wait
        // here, under busy_timeout, rather than fail half way through the batch with an
        // SQLITE_BUSY that a deferred transaction could not recover from.
        let broken = run_cached(conn, "BEGIN IMMEDIATE")
            .err()
            .map(|e| classify("starting a write transaction", &e));
        // The lock is held from here (a wait for another process is not this store's hold).
        let began = Instant::now();
        Open {
            tx: Tx::new(conn),
            began,
            commands: Vec::with_capacity(max_batch),
            savepoints: false,
            broken,
        }
    }

    fn len(&self) -> usize {
        self.commands.len()
    }

    fn is_broken(&self) -> bool {
        self.broken.is_some()
    }

    /// Runs `command` inside the transaction, so that exactly the successful commands' writes
    /// are in it; a command added to a broken transaction does not run.
    fn add(&mut self, command: Box<dyn Command>) {
        self.commands.push(command);
        if self.broken.is_none()
            && let Err(failure) = self.run_last()
        {
            self.broken = Some(failure);
        }
    }

    fn run_last(&mut self) -> Result<(), Error> {
        let conn = self.tx.conn;
        let Some(command) = self.commands.last_mut() else {
            return Ok(());
        };
        if self.savepoints {
            return in_savepoint(&mut self.tx, command.as_mut());
        }
        let before = conn.total_changes();
        if command.execute(&mut self.tx) {
            return Ok(());
        }
        if conn.is_autocommit() {
            return Err(rolled_back());
        }
        if conn.total_changes() != before {
            // This command failed after some of its statements wrote (a failed statement is
            // undone by SQLite itself; the ones before it are not). Start over, with each
            // command in a savepoint, so that those writes go and the others' stay.
            conn.execute_batch("ROLLBACK; BEGIN IMMEDIATE")
                .map_err(|e| classify("running a write batch", &e))?;
            self.savepoints = true;
            for command in &mut self.commands {
                in_savepoint(&mut self.tx, command.as_mut())?;
            }
        }
        Ok(())
    }

    /// Commits, or rolls back a broken transaction; what each command answers is in what it
    /// returns.
    fn finish(mut self, shared: &Shared) -> Finished {
        let counters = &shared.counters;
        let conn = self.tx.conn;
        let worked = u64::try_from(self.began.elapsed().as_nanos()).unwrap_or(u64::MAX);
        counters
            .longest_work_nanos
            .fetch_max(worked, Ordering::Relaxed);
        let failure = if let Some(failure) = self.broken.take() {
            // Nothing in a broken transaction will commit (SQLite rolled it back itself, or a
            // savepoint statement failed), so every command fails, even those that had
            // succeeded.
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            Some(failure)
        } else {
            match run_cached(conn, "COMMIT") {
                Ok(()) => {
                    counters.commits.fetch_add(1, Ordering::Relaxed);
                    counters
                        .commands
                        .fetch_add(self.commands.len() as u64, Ordering::Relaxed);
                    None
                }
                Err(e) => Some(if commit_may_have_landed(&e) {
                    Error::Ambiguous(format!("committing a write transaction: {e}"))
                } else if conn.is_autocommit() || conn.execute_batch("ROLLBACK").is_ok() {
                    // SQLite rolled the transaction back, or we did: nothing was written.
                    Error::Unavailable(format!("committing a write transaction: {e}"))
                } else {
                    Error::Ambiguous(format!(
                        "committing a write transaction failed and could not be rolled back: {e}"
                    ))
                }),
            }
        };
        let held = u64::try_from(self.began.elapsed().as_nanos()).unwrap_or(u64::MAX);
        counters
            .longest_hold_nanos
            .fetch_max(held, Ordering::Relaxed);
        Finished {
            commands: std::mem::take(&mut self.commands),
            failure,
        }
    }
}

/// A batch whose transaction has ended, owing its callers their answers. They are answered
/// once the connection is released, so that a caller who writes again at once finds it free.
#[must_use]
struct Finished {
    commands: Vec<Box<dyn Command>>,
    /// What every command answers instead of its own result: nothing committed, or it is not
    /// known whether anything did.
    failure: Option<Error>,
}

impl Finished {
    fn answer(mut self) {
        answer_all(&mut self.commands, self.failure.as_ref());
    }
}

/// Runs a statement without parameters from the connection's cache: `execute_batch` would
/// parse it again every time, twice per transaction.
fn run_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(drop)
}

fn rolled_back() -> Error {
    // Some errors (a full disk, an I/O error) make SQLite abandon the whole transaction, taking
    // the earlier commands' writes with it.
    Error::Unavailable("SQLite rolled back the write transaction after a failed command".into())
}

/// Runs one command in its own savepoint, so that a failing command (a malformed row, say) is
/// undone alone while the others still commit. An `Err` means the transaction is broken.
fn in_savepoint(tx: &mut Tx<'_>, command: &mut dyn Command) -> Result<(), Error> {
    let broken = |e: rusqlite::Error| classify("running a write batch", &e);
    let conn = tx.conn;
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
    Ok(())
}

fn answer_all(batch: &mut Vec<Box<dyn Command>>, failure: Option<&Error>) {
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

    use super::{Tx, Writer};

    type Work = Arc<dyn Fn(&mut Tx<'_>) -> Result<(), Error> + Send + Sync>;

    fn writer(dir: &tempfile::TempDir) -> Writer {
        let conn = Connection::open(dir.path().join("w.sqlite")).expect("a database");
        conn.execute_batch("CREATE TABLE t (name TEXT PRIMARY KEY)")
            .expect("a table");
        Writer::spawn(conn, 64, Arc::default()).expect("a writer")
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

    /// Runs `commands` in one batch: a first command holds the writer, inside the batch's
    /// transaction, until all of them are queued behind it; they join its batch. Returns each
    /// command's answer and how often each ran.
    async fn one_batch(
        writer: &Writer,
        commands: Vec<Work>,
    ) -> (Vec<Result<(), Error>>, Vec<usize>) {
        let (started, running) = mpsc::channel::<()>();
        let (release, hold) = mpsc::channel::<()>();
        let hold = std::sync::Mutex::new(hold);
        let mut holding = Box::pin(writer.submit(move |_| {
            let _ = started.send(());
            // Returns at once once `release` is gone, when a redo runs it again.
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
        let writer = writer(&dir);
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
        // The holding command and the three behind it: one commit, four commands.
        let stats = writer.stats();
        assert_eq!((stats.commits, stats.commands), (1, 4));
    }

    /// The name of the thread a write ran on, with the write itself.
    async fn written_on(writer: &Writer, name: &'static str) -> Option<String> {
        writer
            .submit(move |tx| {
                insert(tx.conn, name)?;
                Ok(std::thread::current().name().map(str::to_owned))
            })
            .await
            .expect("the write commits")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lone_caller_commits_on_its_own_thread_and_a_wave_on_the_writer_thread() {
        let dir = tempfile::tempdir().unwrap();
        let writer = writer(&dir);
        let writer_thread = Some("idemgate-sqlite-writer".to_owned());
        // Callers one at a time: no hand-off.
        assert_ne!(written_on(&writer, "a").await, writer_thread);
        assert_ne!(written_on(&writer, "b").await, writer_thread);
        // After a batch of several commands, the next write goes to the writer thread, where
        // the rest of a wave would join it; that batch held one command, so the one after is
        // the caller's own again.
        writer.shared.wave.store(2, Ordering::Relaxed);
        assert_eq!(written_on(&writer, "c").await, writer_thread);
        assert_ne!(written_on(&writer, "d").await, writer_thread);
        assert_eq!(names(&dir), vec!["a", "b", "c", "d"]);
        let stats = writer.stats();
        assert_eq!((stats.commits, stats.commands), (4, 4));
    }

    /// A write made from a thread of its own (not one of the runtime's) inside the runtime, on
    /// a thread marked as an event loop or not: the thread it was committed on, and how long it
    /// took.
    fn written_from_thread(
        writer: &Writer,
        name: &'static str,
        event_loop: bool,
    ) -> (Option<String>, std::time::Duration) {
        let runtime = tokio::runtime::Handle::current();
        tokio::task::block_in_place(|| {
            std::thread::scope(|s| {
                s.spawn(|| {
                    if event_loop {
                        idemgate_core::store::never_wait_on_this_thread();
                    }
                    let started = std::time::Instant::now();
                    let thread = runtime.block_on(written_on(writer, name));
                    (thread, started.elapsed())
                })
                .join()
                .expect("the thread ends")
            })
        })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_event_loops_write_goes_to_the_writer_thread_and_never_waits_for_a_wave() {
        let dir = tempfile::tempdir().unwrap();
        let linger = std::time::Duration::from_secs(1);
        let writer = Writer::spawn_lingering(
            {
                let conn = Connection::open(dir.path().join("w.sqlite")).expect("a database");
                conn.execute_batch("CREATE TABLE t (name TEXT PRIMARY KEY)")
                    .expect("a table");
                conn
            },
            64,
            Arc::default(),
            linger,
        )
        .expect("a writer");
        let writer_thread = Some("idemgate-sqlite-writer".to_owned());
        // Alone: an ordinary thread commits its own write; an event loop never waits for a
        // commit, so its write goes to the writer thread.
        let (thread, _) = written_from_thread(&writer, "a", false);
        assert_ne!(thread, writer_thread);
        let (thread, _) = written_from_thread(&writer, "b", true);
        assert_eq!(thread, writer_thread);
        // After a wave of four, an ordinary caller's write waits on the writer thread for the
        // rest of the wave (here a whole second); an event loop's is committed as it comes.
        writer.shared.wave.store(4, Ordering::Relaxed);
        let (thread, took) = written_from_thread(&writer, "c", false);
        assert_eq!(thread, writer_thread);
        assert!(
            took >= linger,
            "the batch did not wait for the wave: {took:?}"
        );
        writer.shared.wave.store(4, Ordering::Relaxed);
        let (thread, took) = written_from_thread(&writer, "d", true);
        assert_eq!(thread, writer_thread);
        assert!(
            took < linger,
            "an event loop's write waited for a wave: {took:?}"
        );
        assert_eq!(names(&dir), vec!["a", "b", "c", "d"]);
    }

    #[test]
    fn a_caller_is_alone_only_when_nobody_writes_or_waits() {
        let dir = tempfile::tempdir().unwrap();
        let writer = writer(&dir);
        let shared = &writer.shared;
        assert!(shared.alone().is_some());
        // The last batch held several commands: a wave may still be arriving.
        shared.wave.store(2, Ordering::Relaxed);
        assert!(shared.alone().is_none());
        shared.wave.store(1, Ordering::Relaxed);
        // A command waits for the writer thread: it is not overtaken.
        shared.queued.store(1, Ordering::Relaxed);
        assert!(shared.alone().is_none());
        shared.queued.store(0, Ordering::Relaxed);
        // Somebody else holds the connection.
        let held = shared.alone().expect("the connection is free");
        assert!(shared.alone().is_none());
        drop(held);
        assert!(shared.alone().is_some());
    }

    #[tokio::test]
    async fn on_a_single_threaded_runtime_every_write_goes_to_the_writer_thread() {
        let dir = tempfile::tempdir().unwrap();
        let writer = writer(&dir);
        // Blocking the only thread of the runtime on an fsync would stall every other task.
        for name in ["a", "b"] {
            assert_eq!(
                written_on(&writer, name).await.as_deref(),
                Some("idemgate-sqlite-writer")
            );
        }
    }

    #[tokio::test]
    async fn a_command_that_fails_before_writing_costs_no_redo() {
        let dir = tempfile::tempdir().unwrap();
        let writer = writer(&dir);
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
