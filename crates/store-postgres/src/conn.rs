//! Connections: checkout from the pool, client-side deadlines, and the one place where a
//! PostgreSQL failure becomes a [`store::Error`].
//!
//! # How failures are classified
//!
//! The executor must know whether a failed write may have committed, because a write that may
//! have committed cannot be retried as if nothing happened. The rules, in order:
//!
//! 1. **Reads** (`get`, `list`, `events`, …) change nothing, so every failure of a read is
//!    [`store::Error::Unavailable`].
//! 2. **Before the write was sent** — the pool could not hand out a connection (connection
//!    refused, pool wait timed out, pool closed), preparing the statement failed (a separate
//!    round trip that writes nothing), or the connection was already closed when the statement
//!    was about to be sent — nothing can have changed: `Unavailable`.
//! 3. **The server answered the write with an ERROR** (statement timeout, deadlock, a violated
//!    constraint): every write here is one statement in its own implicit transaction, and a
//!    statement that ends in an ERROR is rolled back whole, so nothing changed: `Unavailable`.
//! 4. **The server ended the session (FATAL or PANIC, e.g. `57P01 admin_shutdown` during a
//!    restart), the connection broke, or the client-side deadline passed after the write was
//!    sent**: the implicit commit may have completed just before the end, and no answer says
//!    which. [`store::Error::Ambiguous`] — the caller reads the record again.
//! 5. **Inside the one explicit transaction** (the claim under a duplicate-intent window), no
//!    statement before `COMMIT` can make anything durable, so their failures are
//!    `Unavailable` whatever they do (they run as [`Kind::Read`]), and the transaction is
//!    rolled back — or the connection dropped, which rolls it back on the server. `COMMIT`
//!    itself is the write, classified by rules 3 and 4.
//!
//! A connection whose deadline passed is detached from the pool and dropped, so a hung
//! connection is never handed to the next caller.

use std::time::Duration;

use deadpool_postgres::{Object, Pool, PoolError};
use idemgate_core::store;
use tokio_postgres::error::Severity;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Row, Statement};

/// Whether a statement may change the database, which decides how its failures read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Read,
    Write,
}

/// A pooled connection that remembers whether it must not go back to the pool.
pub(crate) struct Conn {
    object: Option<Object>,
    /// Set when a deadline passed mid-statement: the connection may still be waiting for an
    /// answer that will never come, and must not be reused.
    broken: bool,
    deadline: Option<Duration>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        if self.broken
            && let Some(object) = self.object.take()
        {
            // Taking the client out of the pool and dropping it closes the socket.
            drop(Object::take(object));
        }
    }
}

/// Checks a connection out of the pool. Nothing has been sent yet, so every failure here is
/// `Unavailable`.
pub(crate) async fn checkout(
    pool: &Pool,
    deadline: Option<Duration>,
) -> Result<Conn, store::Error> {
    let object = pool.get().await.map_err(|e| match e {
        PoolError::Timeout(kind) => store::Error::Unavailable(format!(
            "no database connection within the timeout ({kind:?})"
        )),
        PoolError::Backend(e) => {
            // `describe` keeps the server's reason (too many connections, starting up, …),
            // which the error's own `Display` reduces to "db error".
            store::Error::Unavailable(format!("cannot connect to the database: {}", describe(&e)))
        }
        PoolError::Closed => store::Error::Unavailable("the connection pool is closed".into()),
        other => store::Error::Unavailable(format!("cannot get a database connection: {other}")),
    })?;
    Ok(Conn {
        object: Some(object),
        broken: false,
        deadline,
    })
}

impl Conn {
    fn object(&self) -> &Object {
        // The object is only taken in `drop`.
        self.object.as_ref().expect("connection present until drop")
    }

    /// Prepares `sql` once per connection (deadpool's statement cache). Preparing writes
    /// nothing, so its failures are `Unavailable` whatever the statement does.
    pub(crate) async fn prepare(&mut self, sql: &str) -> Result<Statement, store::Error> {
        let object = self.object.as_ref().expect("connection present until drop");
        let prepared = match self.deadline {
            Some(limit) => match tokio::time::timeout(limit, object.prepare_cached(sql)).await {
                Ok(result) => result,
                Err(_) => {
                    self.broken = true;
                    return Err(store::Error::Unavailable(format!(
                        "preparing a statement took longer than {limit:?}"
                    )));
                }
            },
            None => object.prepare_cached(sql).await,
        };
        prepared.map_err(|e| store::Error::Unavailable(format!("cannot prepare a statement: {e}")))
    }

    /// Runs a prepared statement and classifies its failure by `kind` (see the module's rules).
    pub(crate) async fn query(
        &mut self,
        kind: Kind,
        statement: &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, store::Error> {
        self.exchange(kind, |object| Box::pin(object.query(statement, params)))
            .await
    }

    /// Sends one exchange built by `send` on this connection, under the statement deadline, and
    /// classifies its failure by `kind`; marks the connection broken when it cannot be trusted
    /// again.
    async fn exchange<'a>(
        &'a mut self,
        kind: Kind,
        send: impl FnOnce(
            &'a Object,
        ) -> std::pin::Pin<
            Box<
                dyn std::future::Future<Output = Result<Vec<Row>, tokio_postgres::Error>>
                    + Send
                    + 'a,
            >,
        >,
    ) -> Result<Vec<Row>, store::Error> {
        if self.object().is_closed() {
            // Rule 2: the statement cannot have left this process.
            self.broken = true;
            return Err(store::Error::Unavailable(
                "the database connection was closed before the statement was sent".into(),
            ));
        }
        let deadline = self.deadline;
        let object = self.object.as_ref().expect("connection present until drop");
        let sent = send(object);
        let answer = match deadline {
            Some(limit) => match tokio::time::timeout(limit, sent).await {
                Ok(answer) => answer,
                Err(_) => {
                    self.broken = true;
                    let what = format!("no answer from the database within {limit:?}");
                    return Err(match kind {
                        Kind::Read => store::Error::Unavailable(what),
                        Kind::Write => store::Error::Ambiguous(what),
                    });
                }
            },
            None => sent.await,
        };
        answer.map_err(|e| {
            if e.is_closed() || ends_session(&e) {
                self.broken = true;
            }
            classify(kind, &e)
        })
    }

    /// Prepares and runs `sql` in one call.
    pub(crate) async fn run(
        &mut self,
        kind: Kind,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, store::Error> {
        let statement = self.prepare(sql).await?;
        self.query(kind, &statement, params).await
    }

    /// Runs `sql` as an unnamed statement with declared parameter types: parse, bind and execute
    /// in one round trip, planned for these parameter values every time (an unnamed statement
    /// never reaches PostgreSQL's generic plan). For the statements whose best plan depends on
    /// the values or on the table's current size (listing by a rare or a common status, the
    /// recoverer's and the sweep's ranges), where a plan cached on other values could read
    /// far more than it needs. Failures classify exactly as in [`Conn::query`]: the parse is
    /// part of the same exchange, and a statement that fails to parse is an ERROR, which
    /// changed nothing.
    pub(crate) async fn run_planned(
        &mut self,
        kind: Kind,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, store::Error> {
        self.exchange(kind, |object| Box::pin(object.query_typed(sql, params)))
            .await
    }

    /// Sends `sql` (transaction control: `BEGIN`, `COMMIT`, `ROLLBACK`) with the simple query
    /// protocol, under the statement deadline, its failure classified by `kind` like any
    /// statement's.
    pub(crate) async fn control(
        &mut self,
        kind: Kind,
        sql: &'static str,
    ) -> Result<(), store::Error> {
        self.exchange(kind, |object| {
            Box::pin(async move { object.batch_execute(sql).await.map(|()| Vec::new()) })
        })
        .await
        .map(drop)
    }

    /// Ends an explicit transaction that will not commit. The connection goes back to the pool
    /// only when the rollback was answered: a connection left inside a transaction (or an
    /// aborted one) would hand its next user a session that holds locks and refuses every
    /// statement, and the pool's fast recycling would not notice.
    pub(crate) async fn roll_back(&mut self) {
        if self.broken || self.control(Kind::Read, "ROLLBACK").await.is_err() {
            self.broken = true;
        }
    }

    /// The underlying client, for the migration's explicit transaction.
    pub(crate) fn client_mut(&mut self) -> &mut Object {
        self.object.as_mut().expect("connection present until drop")
    }
}

/// Whether the server ended the session with this error rather than just the statement.
fn ends_session(e: &tokio_postgres::Error) -> bool {
    // `parsed_severity` reads the protocol's non-localised severity field, so this holds
    // whatever `lc_messages` the server uses.
    matches!(
        e.as_db_error().and_then(|db| db.parsed_severity()),
        Some(Severity::Fatal | Severity::Panic)
    )
}

/// Rules 1, 3 and 4 of the module documentation, for an error raised by a statement that was
/// handed to the connection.
pub(crate) fn classify(kind: Kind, e: &tokio_postgres::Error) -> store::Error {
    let text = describe(e);
    match kind {
        Kind::Read => store::Error::Unavailable(text),
        Kind::Write if e.as_db_error().is_some() && !ends_session(e) => {
            store::Error::Unavailable(text)
        }
        Kind::Write => store::Error::Ambiguous(text),
    }
}

/// A one-line description that keeps the SQLSTATE, for logs; never request data.
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("database error {}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}
