//! The default [`Timer`]: the async runtime's clock.

use std::time::Duration;

use idemgate_core::clock::Timer;
use idemgate_core::store::BoxFuture;

/// Waits with `tokio::time::sleep`, so a test on a paused runtime moves it with
/// `tokio::time::advance`.
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioTimer;

impl Timer for TokioTimer {
    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(duration))
    }
}
