//! The process's one tokio runtime, and the way JavaScript waits on it: a promise resolved from
//! the runtime's threads.
//!
//! The runtime is built on first use (the first `Local`) and shared by every `Local` of the
//! process. Node's event loop never waits on it: the operator's methods and reads return a
//! promise at once, and the engine's task resolves it through Node-API's deferred (a
//! thread-safe call back onto the event loop) when it ends. A call of a tool is polled on the
//! event loop instead ([`crate::event_loop`]), with this runtime entered for its timers and the
//! tasks it spawns.
//!
//! A call that memory alone answers (a replay of a settled record, [`settled_now`]) does not
//! go there and back: it runs on the event loop's thread, which it cannot block because it
//! is not async (it has no store to wait on), and its promise is settled before it is
//! returned.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::OnceLock;

use napi::bindgen_prelude::{JsValue, Object, PromiseRaw, ToNapiValue};
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

/// A promise settled now with what `answer` gives on this thread, or `None` when it gives
/// nothing (the caller then goes to the runtime with [`promise`]). `answer` must not wait on
/// anything: it runs on Node's event loop. A panic inside it rejects the promise; it never
/// unwinds into Node.
pub fn settled_now<'env, T: ToNapiValue>(
    env: &'env Env,
    answer: impl FnOnce() -> Option<T>,
) -> Option<napi::Result<Object<'env>>> {
    let settled = match std::panic::catch_unwind(AssertUnwindSafe(answer)) {
        Ok(None) => return None,
        Ok(Some(value)) => PromiseRaw::resolve(env, value),
        Err(panic) => PromiseRaw::reject(env, internal(&*panic)),
    };
    Some(settled.map(|p| Object::from_raw(env.raw(), p.raw())))
}

/// Debug builds only: `IDEMGATE_NODE_TEST_PANIC=<point>` panics at that point of the binding,
/// so the tests can prove a panic there never reaches Node. Release builds have no such hook.
pub fn test_panic(point: &str) {
    #[cfg(debug_assertions)]
    if std::env::var("IDEMGATE_NODE_TEST_PANIC").as_deref() == Ok(point) {
        panic!("IDEMGATE_NODE_TEST_PANIC={point}");
    }
    #[cfg(not(debug_assertions))]
    let _ = point;
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
