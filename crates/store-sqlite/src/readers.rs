//! The pool of read connections.
//!
//! In WAL mode readers do not wait for the writer, nor for each other, so reads are never
//! queued behind a group commit. A read by primary key takes microseconds, so it runs inline on
//! the caller's task under a `std::sync::Mutex`: handing it to a thread and back would cost more
//! than the read, and the lock is never held across an `.await`. (The same reasoning as
//! mini-redis's std mutex around its shared state.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};

use idemgate_core::store::Error;
use rusqlite::Connection;

pub(crate) struct Readers {
    conns: Box<[Mutex<Connection>]>,
    next: AtomicUsize,
}

impl Readers {
    pub(crate) fn new(conns: Vec<Connection>) -> Readers {
        Readers {
            conns: conns.into_iter().map(Mutex::new).collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// Runs `read` on a free connection: round-robin over `try_lock` so that concurrent readers
    /// spread over the pool, then blocking on one when all are busy.
    pub(crate) fn with<T>(
        &self,
        read: impl FnOnce(&Connection) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let count = self.conns.len();
        if count == 0 {
            return Err(Error::Unavailable(
                "the SQLite store has no read connections".into(),
            ));
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        for i in 0..count {
            match self.conns[(start + i) % count].try_lock() {
                Ok(conn) => return read(&conn),
                // A panic while reading leaves the connection itself sound (statements are
                // reset when dropped), so a poisoned lock is taken over.
                Err(TryLockError::Poisoned(poisoned)) => return read(&poisoned.into_inner()),
                Err(TryLockError::WouldBlock) => {}
            }
        }
        let conn: MutexGuard<'_, Connection> = self.conns[start % count]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        read(&conn)
    }
}
