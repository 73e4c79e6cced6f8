//! A tool's JavaScript functions as the engine's traits: the tool's function is its
//! [`Downstream`]'s `perform`, its optional lookup `lookup_receipt`, its optional job poller
//! `poll_job`, and its optional `authorize` its [`Authorizer`].
//!
//! Nothing here decides anything about claims, fences, recovery or labels: each function's
//! answer is classified into the engine's terms ([`EffectOutcome`], [`Lookup`], [`JobStatus`])
//! and the engine does the rest. The TypeScript side hands over *adapters* (`src/local.ts`),
//! async functions that call the user's function, catch whatever it throws, and resolve to a
//! JSON array saying what it did — `["committed", reference, result]`, `["job", jobId]`,
//! `["not_sent", reason, retryAfter]`, `["refused", message]`, `["ambiguous", evidence]` — so
//! every exception of the user's code is read in JavaScript, where its class and message are.
//!
//! Each call goes through a Node-API thread-safe function: queued onto Node's event loop from
//! the future that calls it (itself polled on the event loop for `invoke`, on the runtime for
//! the recoverer and the operator's reads), and its promise awaited by that future, never
//! blocking the loop.
//! The thread-safe functions are weak: a registered tool does not keep the process alive.

use std::time::Duration;

use idemgate_core::effect::{
    AuthRequest, AuthStage, Authorization, Authorizer, Downstream, EffectOutcome, EffectRequest,
    JobStatus, Lookup,
};
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::ErrorCode;
use idemgate_core::record::{Receipt, Refusal};
use idemgate_core::store::BoxFuture;
use napi::Status;
use napi::bindgen_prelude::{FnArgs, Promise};
use napi::threadsafe_function::ThreadsafeFunction;
use serde_json::Value;

use crate::runtime::{futures_catch, panic_text};

/// The perform adapter: `(argumentsJson, operationKey) => Promise<answerJson>`.
pub type PerformFn = ThreadsafeFunction<
    FnArgs<(String, String)>,
    Promise<String>,
    FnArgs<(String, String)>,
    Status,
    false,
    true,
>;
/// The lookup adapter: `(operationKey) => Promise<answerJson>`.
pub type LookupFn = ThreadsafeFunction<String, Promise<String>, String, Status, false, true>;
/// The job poller's adapter: `(jobId, operationKey) => Promise<answerJson>`.
pub type PollFn = PerformFn;
/// The authorization adapter: `(requestJson) => Promise<answerJson>`.
pub type AuthorizeFn = LookupFn;

/// Why a call of a JavaScript function gave no answer: it may have run (it did not answer in
/// time, or its promise broke in a way that does not say how far it got).
fn overdue(limit: Duration) -> String {
    format!(
        "the function did not return within its timeout of {} s",
        limit.as_secs_f64()
    )
}

/// Awaits an adapter's answer, up to `timeout`: the parsed JSON array, or why there is none.
async fn answer<F>(call: F, timeout: Option<Duration>) -> Result<Vec<Value>, String>
where
    F: std::future::Future<Output = napi::Result<String>>,
{
    let text = match timeout {
        Some(limit) => match tokio::time::timeout(limit, call).await {
            Ok(answer) => answer,
            Err(_) => return Err(overdue(limit)),
        },
        None => call.await,
    }
    .map_err(|e| format!("the call of the function failed: {}", e.reason))?;
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Array(items)) if items.first().is_some_and(Value::is_string) => Ok(items),
        _ => Err("the adapter answered something that is not [kind, ...]".into()),
    }
}

fn text(item: Option<&Value>) -> Option<String> {
    item.and_then(Value::as_str).map(str::to_string)
}

fn retry_after(item: Option<&Value>) -> Option<u64> {
    item.and_then(Value::as_u64)
}

/// A receipt from an answer's `reference` and `result` members; `default_reference` when the
/// function named none (a plain JSON result).
fn receipt(
    items: &[Value],
    default_reference: Option<&str>,
    whose: &str,
) -> Result<Receipt, String> {
    let reference = match (text(items.get(1)), default_reference) {
        (Some(r), _) if !r.is_empty() => r,
        (_, Some(d)) => d.to_string(),
        _ => return Err(format!("{whose} gave a Receipt without a reference")),
    };
    Ok(Receipt {
        reference,
        result: items.get(2).cloned().unwrap_or(Value::Null),
    })
}

/// What the function's adapter said it did, in the engine's terms.
fn effect_of(items: &[Value], key: &str) -> EffectOutcome {
    let kind = items.first().and_then(Value::as_str).unwrap_or_default();
    match kind {
        "committed" => match receipt(items, Some(key), "the function") {
            Ok(receipt) => EffectOutcome::Committed(receipt),
            // The function returned normally, so the effect may well have happened: never a
            // release, never a refusal.
            Err(why) => EffectOutcome::ambiguous(format!("{why}; the effect may have happened")),
        },
        // Whether the contract declares jobs is the engine's to check: a job it does not
        // declare is ambiguous there.
        "job" => match text(items.get(1)) {
            Some(job_id) if !job_id.is_empty() => EffectOutcome::Accepted { job_id },
            _ => EffectOutcome::ambiguous("the function returned a Job without a job id"),
        },
        "not_sent" => EffectOutcome::NotSent {
            reason: text(items.get(1)).unwrap_or_else(|| "not sent".into()),
            retry_after: retry_after(items.get(2)),
        },
        "refused" => EffectOutcome::Refused(Refusal {
            code: ErrorCode::DownstreamRejected,
            message: text(items.get(1)).unwrap_or_else(|| "refused".into()),
        }),
        "ambiguous" => EffectOutcome::Ambiguous {
            reason: text(items.get(1)).unwrap_or_else(|| "the function failed".into()),
            retry_after: retry_after(items.get(2)),
        },
        other => {
            EffectOutcome::ambiguous(format!("the adapter answered an unknown kind {other:?}"))
        }
    }
}

fn lookup_of(items: &[Value]) -> Lookup {
    match items.first().and_then(Value::as_str).unwrap_or_default() {
        "found" => match receipt(items, None, "the lookup") {
            Ok(receipt) => Lookup::Found(receipt),
            Err(why) => Lookup::Unavailable(why),
        },
        "not_found" => Lookup::NotFound,
        other => Lookup::Unavailable(text(items.get(1)).unwrap_or_else(|| other.to_string())),
    }
}

/// What the job poller's adapter said of the job: `["running"]`, `["done", reference,
/// result]`, `["failed", message]` (a refusal), `["gone", reason]`, or `["unavailable",
/// reason]` when the poller could not tell.
fn job_of(items: &[Value]) -> JobStatus {
    let kind = items.first().and_then(Value::as_str).unwrap_or_default();
    let why = || text(items.get(1)).unwrap_or_else(|| kind.to_string());
    match kind {
        "running" => JobStatus::Running,
        "done" => match receipt(items, None, "the job poller") {
            Ok(receipt) => JobStatus::Done(receipt),
            Err(why) => JobStatus::Unavailable(why),
        },
        "failed" => JobStatus::Failed(Refusal {
            code: ErrorCode::DownstreamRejected,
            message: why(),
        }),
        "gone" => JobStatus::Gone(why()),
        _ => JobStatus::Unavailable(why()),
    }
}

/// A tool's functions as its downstream.
pub struct JsEffect {
    pub perform: PerformFn,
    pub lookup: Option<LookupFn>,
    pub poll: Option<PollFn>,
    /// How long the function may take before its answer counts as lost (ambiguous).
    pub timeout: Option<Duration>,
}

/// A panic while the function's call is under way may have followed the effect: it becomes an
/// ambiguous answer, which the engine recovers by the lookup or ends `unknown` — never a
/// refusal, and never a panic in the engine's task.
async fn guarded<T>(
    future: impl std::future::Future<Output = T>,
    on_panic: impl FnOnce(String) -> T,
) -> T {
    match futures_catch(future).await {
        Ok(answer) => answer,
        Err(panic) => {
            let what = format!(
                "idemgate's engine failed internally: {}",
                panic_text(&*panic)
            );
            tracing::error!(panic = %what, "idemgate's binding panicked around a tool's function");
            on_panic(what)
        }
    }
}

/// Debug builds only: `IDEMGATE_NODE_TEST_PANIC=after_call` panics after every call of a tool's
/// function, so the tests can prove a panic never reaches Node and never turns a call that may
/// have had its effect into a refusal. Release builds have no such hook.
fn test_panic_after_call() {
    #[cfg(debug_assertions)]
    if std::env::var("IDEMGATE_NODE_TEST_PANIC").as_deref() == Ok("after_call") {
        panic!("IDEMGATE_NODE_TEST_PANIC=after_call");
    }
}

impl Downstream for JsEffect {
    fn perform<'a>(&'a self, request: EffectRequest<'a>) -> BoxFuture<'a, EffectOutcome> {
        let key = request.key.to_string();
        let arguments = request.arguments.to_string();
        Box::pin(guarded(
            async move {
                let call = async {
                    let promise = self
                        .perform
                        .call_async_catch((arguments, key.clone()).into())
                        .await?;
                    promise.await
                };
                let answered = answer(call, self.timeout).await;
                test_panic_after_call();
                match answered {
                    Ok(items) => effect_of(&items, &key),
                    Err(why) => EffectOutcome::ambiguous(why),
                }
            },
            EffectOutcome::ambiguous,
        ))
    }

    fn lookup_receipt<'a>(&'a self, key: &'a OperationKey) -> BoxFuture<'a, Lookup> {
        let key = key.to_string();
        Box::pin(guarded(
            async move {
                let Some(lookup) = &self.lookup else {
                    return Lookup::Unavailable("this tool has no lookup".into());
                };
                let call = async {
                    let promise = lookup.call_async_catch(key).await?;
                    promise.await
                };
                match answer(call, self.timeout).await {
                    Ok(items) => lookup_of(&items),
                    Err(why) => Lookup::Unavailable(why),
                }
            },
            Lookup::Unavailable,
        ))
    }

    fn poll_job<'a>(&'a self, key: &'a OperationKey, job_id: &'a str) -> BoxFuture<'a, JobStatus> {
        let key = key.to_string();
        let job_id = job_id.to_string();
        Box::pin(guarded(
            async move {
                let Some(poll) = &self.poll else {
                    return JobStatus::Unavailable("this tool has no job poller".into());
                };
                let call = async {
                    let promise = poll.call_async_catch((job_id, key).into()).await?;
                    promise.await
                };
                // A poller that cannot answer says nothing of the job: it stays pending, and
                // the engine asks again (or ends it at the job's deadline).
                match answer(call, self.timeout).await {
                    Ok(items) => job_of(&items),
                    Err(why) => JobStatus::Unavailable(why),
                }
            },
            JobStatus::Unavailable,
        ))
    }
}

/// A tool's `authorize` function as its hook, asked before every effect and every replay. Its
/// adapter answers `["allowed"]`, `["denied", reason]` or `["unavailable", reason]`; a hook
/// that cannot answer (it threw, it timed out, the binding failed) fails closed.
pub struct JsHook {
    pub authorize: AuthorizeFn,
    pub timeout: Option<Duration>,
}

impl Authorizer for JsHook {
    fn authorize<'a>(&'a self, request: AuthRequest<'a>) -> BoxFuture<'a, Authorization> {
        // Never the arguments: their fingerprint only, as for every hook.
        let text = serde_json::json!({
            "tenant": request.tenant,
            "actor": request.actor,
            "role": request.role,
            "tool": request.tool,
            "operation_key": request.key.map(|k| k.as_str()),
            "fingerprint": request.fingerprint.as_str(),
            "stage": match request.stage {
                AuthStage::BeforeEffect => "before_effect",
                AuthStage::BeforeReplay => "before_replay",
            },
        })
        .to_string();
        Box::pin(guarded(
            async move {
                let call = async {
                    let promise = self.authorize.call_async_catch(text).await?;
                    promise.await
                };
                match answer(call, self.timeout).await {
                    Ok(items) => {
                        let why = text_at(&items, 1);
                        match items.first().and_then(Value::as_str).unwrap_or_default() {
                            "allowed" => Authorization::Allowed,
                            "denied" => {
                                Authorization::Denied(why.unwrap_or_else(|| "denied".into()))
                            }
                            other => {
                                Authorization::Unavailable(why.unwrap_or_else(|| other.into()))
                            }
                        }
                    }
                    Err(why) => Authorization::Unavailable(why),
                }
            },
            Authorization::Unavailable,
        ))
    }
}

fn text_at(items: &[Value], i: usize) -> Option<String> {
    text(items.get(i))
}
