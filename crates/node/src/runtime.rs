//! The process's one tokio runtime, and the way JavaScript waits on it: a promise resolved from
//! the runtime's threads.
//!
//! The runtime is built on first use (the first `Local`) and shared by every `Local` of the
//! process. Node's event loop never waits on it: each call of the engine returns a promise at
//! once, and the engine's task resolves it through Node-API's deferred (a thread-safe call back
//! onto the event loop) when it ends.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::OnceLock;

use napi::bindgen_prelude::{Object, ToNapiValue};
use napi::{Env, Error, Status};
use tokio::runtime::Runtime;

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

/// The runtime, started on first use in this process.
pub fn runtime() -> napi::Result<&'static Runtime> {
    if let Some(runtime) = RUNTIME.get() {
        return Ok(runtime);
    }
    let built = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("idemgate")
        .build()
        .map_err(|e| Error::new(Status::GenericFailure, format!("idemgate's runtime: {e}")))?;
    // Two first calls at once: one runtime is kept, the other dropped unused.
    Ok(RUNTIME.get_or_init(|| built))
}

/// A panic's payload as a JavaScript error.
pub fn internal(panic: &(dyn std::any::Any + Send)) -> Error {
    Error::new(
        Status::GenericFailure,
        format!("idemgate's engine failed internally: {}", panic_text(panic)),
    )
}

/// What a panic said, when it said it as text.
pub fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

/// Runs `future` on the runtime and answers a promise of its output at once. A panic while the
/// future is polled rejects the promise with an error; it never unwinds into Node.
pub fn promise<T, F>(env: &Env, future: F) -> napi::Result<Object<'_>>
where
    T: ToNapiValue + Send + 'static,
    F: Future<Output = napi::Result<T>> + Send + 'static,
{
    let runtime = runtime()?;
    let (deferred, promise) = env.create_deferred::<T, _>()?;
    runtime.spawn(async move {
        match futures_catch(future).await {
            Ok(Ok(value)) => deferred.resolve(move |_| Ok(value)),
            Ok(Err(error)) => deferred.reject(error),
            Err(panic) => deferred.reject(internal(&*panic)),
        }
    });
    Ok(promise)
}

/// Awaits `future`, catching a panic raised while it is polled.
pub async fn futures_catch<F: Future>(
    future: F,
) -> Result<F::Output, Box<dyn std::any::Any + Send + 'static>> {
    let mut future = std::pin::pin!(future);
    std::future::poll_fn(|cx| {
        match std::panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(std::task::Poll::Ready(output)) => std::task::Poll::Ready(Ok(output)),
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Err(panic) => std::task::Poll::Ready(Err(panic)),
        }
    })
    .await
}
