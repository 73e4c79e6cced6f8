//! Time, injected: the executor never reads the system clock itself, so a test or a simulator
//! can move time by hand and replay any run.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use crate::record::Millis;
use crate::store::BoxFuture;

pub trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch.
    fn now(&self) -> Millis;
}

/// The wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Millis {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
    }
}

/// A clock that moves only when told to.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    pub fn new(start: Millis) -> ManualClock {
        ManualClock(AtomicI64::new(start))
    }
    pub fn advance(&self, millis: i64) {
        self.0.fetch_add(millis, Ordering::SeqCst);
    }
    pub fn set(&self, at: Millis) {
        self.0.store(at, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Millis {
        self.0.load(Ordering::SeqCst)
    }
}

/// Waiting, injected like time: the executor's lease renewals and pauses between resends wait
/// through a `Timer`, so a simulator decides when each wait ends (the engine's default waits on
/// the async runtime's clock).
pub trait Timer: Send + Sync {
    /// Completes once `duration` has passed.
    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()>;
}
