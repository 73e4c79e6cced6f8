//! How SQLite's errors become `store::Error`, the classification callers act on.

use idemgate_core::store::Error;
use rusqlite::ErrorCode;

/// Adds what the store was doing to a rusqlite error and classifies it.
pub(crate) trait Context<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T, Error>;
}

impl<T> Context<T> for rusqlite::Result<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T, Error> {
        self.map_err(|e| classify(&what(), &e))
    }
}

/// Classifies a failed statement. The statement's savepoint or transaction is rolled back by
/// the writer when a statement fails, so apart from data that cannot be read, a failure means
/// that nothing changed: `Unavailable`, which a caller may retry.
pub(crate) fn classify(what: &str, e: &rusqlite::Error) -> Error {
    match e {
        rusqlite::Error::SqliteFailure(failure, _) => match failure.code {
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => Error::Unavailable(format!(
                "{what}: the database stayed locked by another writer past the busy timeout ({e})"
            )),
            ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase => {
                Error::Corrupt(format!("{what}: {e}"))
            }
            _ => Error::Unavailable(format!("{what}: {e}")),
        },
        // A column that holds the wrong type was written by something other than this store.
        rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::IntegralValueOutOfRange(..) => Error::Corrupt(format!("{what}: {e}")),
        _ => Error::Unavailable(format!("{what}: {e}")),
    }
}

/// Whether a failed COMMIT may have left the transaction durable. An I/O error can strike
/// after the commit frame reached the write-ahead log but before (or during) its fsync: the
/// write may survive, or not. Every other failure leaves the transaction uncommitted.
pub(crate) fn commit_may_have_landed(e: &rusqlite::Error) -> bool {
    matches!(e.sqlite_error_code(), Some(ErrorCode::SystemIoFailure))
}
