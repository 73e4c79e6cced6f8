//! `NativeLocal`: one [`App`] in this process, the class `idemgate/local`'s `Local` is written
//! over.
//!
//! Each method converts its arguments, makes one call of the app, and converts the answer back.
//! Values cross as JSON text (arguments, results, outcomes), parsed once on each side: an
//! outcome is the body API v1 answers (`outcome`, `operation_key`, `effect_reference`,
//! `safe_to_repeat`, `next_action`, `retry_after_seconds`, `result`, `error`), so the
//! TypeScript side reads it with the HTTP client's own reader. Every call that waits on the
//! store answers a promise at once (`invoke`: [`crate::event_loop::promise`], polled on the
//! event loop; the others: [`runtime::promise`], on the runtime); Node's event loop never waits.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idemgate_app::operations::reason_of;
use idemgate_app::views;
use idemgate_app::{ActError, App, Assembly, Background, Recovery, Tool, ToolSet};
use idemgate_core::fingerprint::Fingerprint;
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::{ErrorCode, Outcome};
use idemgate_core::record::RecordStatus;
use idemgate_core::store::Filter;
use idemgate_engine::{ActionError, Caller, Resolution, StatusRead};
use napi::bindgen_prelude::Object;
use napi::{Env, Error, Status};
use napi_derive::napi;
use serde_json::{Value, json};

use crate::effect::{AuthorizeFn, JsEffect, JsHook, LookupFn, PerformFn, PollFn};
use crate::runtime::{self, promise};
use crate::spec;

fn invalid(message: impl Into<String>) -> Error {
    Error::new(Status::InvalidArg, message.into())
}

fn check_part(name: &str, value: &str) -> napi::Result<()> {
    // A key of these parts is checked by the same rules as every key.
    let (tenant, environment) = match name {
        "tenant" => (value, "e"),
        _ => ("t", value),
    };
    OperationKey::new(tenant, environment, "w", "s")
        .map(|_| ())
        .map_err(|e| invalid(format!("{name}: {e}")))
}

fn seconds(name: &str, value: f64) -> napi::Result<Duration> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| invalid(format!("{name} is a number of seconds above 0")))
}

/// An outcome as API v1's body: the outcome's own members, and `outcome` beside `status`.
fn outcome_body(o: &Outcome) -> Value {
    let mut body = serde_json::to_value(o).unwrap_or_else(|_| json!({}));
    body["safe_to_repeat"] = Value::Bool(o.safe_to_repeat());
    body["outcome"] = body["status"].clone();
    body
}

fn outcome_text(o: &Outcome) -> String {
    outcome_body(o).to_string()
}

/// What an operator's action that was not carried out answers: `not_found` for a key this
/// caller has no operation under, `store_unavailable`, or `conflict` with the engine's reason
/// — the same codes API v1 answers.
fn refused(key: Option<&OperationKey>, e: ActError) -> Outcome {
    let (code, message) = match e {
        ActError::NotFound(_) | ActError::Action(ActionError::NotFound(_)) => {
            (ErrorCode::NotFound, "no such operation".to_string())
        }
        ActError::Action(ActionError::Store(e)) => {
            tracing::warn!(error = %e, "operator action: store unavailable");
            (
                ErrorCode::StoreUnavailable,
                "the operation store could not be read".to_string(),
            )
        }
        other => (ErrorCode::Conflict, other.to_string()),
    };
    Outcome::rejected(key.cloned(), code, message)
}

/// The answer for a key that names no operation of this caller (a malformed one included).
fn no_operation() -> Outcome {
    Outcome::rejected(None, ErrorCode::NotFound, "no such operation")
}

/// One application over one store, serving the tools registered on it.
#[napi]
pub struct NativeLocal {
    app: App,
    caller: Caller,
    recoverer: Arc<Mutex<Option<Background>>>,
    closed: AtomicBool,
}

impl NativeLocal {
    fn app(&self) -> napi::Result<App> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::new(
                Status::GenericFailure,
                "this Local is closed; make a new one to go on",
            ));
        }
        Ok(self.app.clone())
    }

    /// The caller of an operator's action: this Local's actor, as an operator.
    fn operator(&self) -> Caller {
        Caller {
            role: "operator".into(),
            ..self.caller.clone()
        }
    }
}

#[napi]
impl NativeLocal {
    /// Opens the store (creating a SQLite file and its schema, or connecting to PostgreSQL and
    /// migrating it) and starts the recoverer when `recover`. Opening waits here, once.
    #[napi(constructor)]
    #[allow(clippy::too_many_arguments)] // the constructor's options, one each
    pub fn new(
        url: String,
        tenant: String,
        environment: String,
        actor: String,
        recover: bool,
        recovery_every: f64,
        sweep_every: f64,
        encryption_key_env: Option<String>,
    ) -> napi::Result<NativeLocal> {
        check_part("tenant", &tenant)?;
        check_part("environment", &environment)?;
        if actor.trim().is_empty() {
            return Err(invalid("actor is empty"));
        }
        let recovery = Recovery {
            every: seconds("recoveryInterval", recovery_every)?,
            sweep_every: seconds("sweepInterval", sweep_every)?,
        };
        let runtime = runtime::runtime()?;
        let store = runtime
            .block_on(idemgate_app::open_gateway_store(
                &url,
                encryption_key_env.as_deref(),
            ))
            .map_err(|e| invalid(format!("url: {e}")))?;
        let app = Assembly::new(store, ToolSet::default(), environment)
            .recovery(recovery)
            .build();
        let recoverer = if recover {
            let _entered = runtime.enter();
            Some(app.start_recoverer())
        } else {
            None
        };
        Ok(NativeLocal {
            app,
            caller: Caller {
                tenant,
                actor,
                role: "agent".into(),
            },
            recoverer: Arc::new(Mutex::new(recoverer)),
            closed: AtomicBool::new(false),
        })
    }

    /// Registers a tool: its contract (the options shaped as a contract, as JSON, or the path of
    /// a contract file) and its adapters (the function, the lookup, the job poller, the
    /// authorization hook). Answers the linter's findings on a file, each
    /// `[level, rule, field, reason]`.
    #[napi]
    #[allow(clippy::too_many_arguments)] // the tool's parts, one each
    pub fn register(
        &self,
        name: String,
        spec: Option<String>,
        contract_path: Option<String>,
        timeout_seconds: Option<f64>,
        perform: PerformFn,
        lookup: Option<LookupFn>,
        poll: Option<PollFn>,
        authorize: Option<AuthorizeFn>,
    ) -> napi::Result<Vec<Vec<String>>> {
        let app = self.app()?;
        if app.tools().get(&name).is_some() {
            return Err(invalid(format!(
                "a tool named {name:?} is already registered on this Local"
            )));
        }
        let (contract, findings) = match (spec, contract_path) {
            (_, Some(path)) => spec::from_file(&path).map_err(invalid)?,
            (Some(spec), None) => {
                let spec: Value = serde_json::from_str(&spec)
                    .map_err(|e| invalid(format!("the tool's options are not JSON: {e}")))?;
                let contract = spec::from_arguments(&name, &spec).map_err(|r| match r.field {
                    Some(field) => invalid(format!("{field}: {}", r.message)),
                    None => invalid(r.message),
                })?;
                (contract, Vec::new())
            }
            (None, None) => return Err(invalid("a tool needs a contract")),
        };
        if contract.name != name {
            return Err(invalid(format!(
                "the contract names the tool {:?}, not {name:?}",
                contract.name
            )));
        }
        // The functions the contract's downstream section promises, and only those (Python's
        // rule): a lookup or poller it does not declare would never be asked, one it declares
        // must be there.
        for (declared, given, field, option) in [
            (
                contract.receipt_lookup(),
                lookup.is_some(),
                "downstream.receipt_lookup",
                "lookup",
            ),
            (
                contract.async_jobs(),
                poll.is_some(),
                "downstream.async_jobs",
                "poll",
            ),
        ] {
            if declared != given {
                return Err(invalid(if declared {
                    format!("the contract declares {field}, so give {option}")
                } else {
                    format!("{option} is given, but the contract does not declare {field}")
                }));
            }
        }
        let timeout = timeout_seconds.map(|t| seconds("timeout", t)).transpose()?;
        app.tools().serve(Tool {
            contract: Arc::new(contract),
            downstream: Arc::new(JsEffect {
                perform,
                lookup,
                poll,
                timeout,
            }),
            authorizer: authorize.map(|authorize| {
                Arc::new(JsHook { authorize, timeout })
                    as Arc<dyn idemgate_core::effect::Authorizer>
            }),
        });
        Ok(findings
            .into_iter()
            .map(|(level, rule, field, reason)| {
                vec![level.to_string(), rule.to_string(), field, reason]
            })
            .collect())
    }

    /// The registered tools' names, sorted.
    #[napi]
    pub fn tools(&self) -> napi::Result<Vec<String>> {
        Ok(self.app()?.tools().names())
    }

    /// One delivery of a call of `tool` with `arguments` (a JSON object's text): its outcome's
    /// body. `wait` delivers again while the answer is `in_flight`, for up to that many seconds.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn invoke<'env>(
        &self,
        env: &'env Env,
        tool: String,
        arguments: String,
        workflow_id: Option<String>,
        step_id: Option<String>,
        wait: Option<f64>,
    ) -> napi::Result<Object<'env>> {
        let app = self.app()?;
        let arguments: Value = serde_json::from_str(&arguments)
            .map_err(|e| invalid(format!("arguments are not JSON: {e}")))?;
        if !arguments.is_object() {
            return Err(invalid("arguments are a JSON object"));
        }
        let wait = wait.map(|w| seconds("wait", w)).transpose()?;
        // A replay of a settled record kept in memory is answered here, on the event loop: the
        // engine's memory-only path reads no store and asks no hook, so it cannot wait.
        let now = runtime::settled_now(env, || {
            let outcome = app.replay_from_memory(
                &self.caller,
                &tool,
                workflow_id.as_deref(),
                step_id.as_deref(),
                &arguments,
            )?;
            runtime::test_panic("replay_from_memory");
            Some(outcome_text(&outcome))
        });
        if let Some(settled) = now {
            return settled;
        }
        let caller = self.caller.clone();
        // Polled on the event loop itself (see `event_loop`): the function is called, and the
        // promise settled, on this thread. A promise cannot be cancelled and nothing drops the
        // future before its end, so the delivery runs in it rather than on a task of its own.
        crate::event_loop::promise(env, async move {
            runtime::test_panic("invoke_polled");
            let outcome = app
                .invoke_awaited(caller, &tool, workflow_id, step_id, arguments, wait)
                .await;
            Ok(outcome_text(&outcome))
        })
    }

    /// An operation for this Local's tenant, as JSON: null when there is none, else
    /// `{"found": body}` (the members API v1 gives it: record, `receipt`, `events`, `outcome`),
    /// `{"denied": outcome}` or `{"error": outcome}` when the store could not be read.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn operation<'env>(&self, env: &'env Env, key: String) -> napi::Result<Object<'env>> {
        let app = self.app()?;
        let caller = self.caller.clone();
        promise(env, async move {
            let Ok(key) = OperationKey::parse(&key) else {
                return Ok("null".into());
            };
            let read = async {
                Ok::<_, idemgate_core::store::Error>(match app.operation(&caller, &key).await? {
                    None => Value::Null,
                    Some(StatusRead::Denied(outcome)) => json!({"denied": outcome_body(&outcome)}),
                    Some(StatusRead::Found { record, outcome }) => {
                        // Read after the record, as API v1 does: the trace that led there.
                        let events = app.executor().store().events(&key).await?;
                        let mut body = views::in_process_summary(&record);
                        body["receipt"] = json!(views::receipt_view(&record));
                        body["events"] = events
                            .into_iter()
                            .map(|e| {
                                json!({"kind": e.kind.as_str(), "at": e.at, "attempt": e.attempt,
                                       "worker": e.worker, "detail": e.detail})
                            })
                            .collect();
                        body["outcome"] = outcome_body(&outcome);
                        json!({ "found": body })
                    }
                })
            }
            .await;
            Ok(match read {
                Ok(value) => value.to_string(),
                Err(e) => {
                    tracing::warn!(error = %e, "operation read: store unavailable");
                    let outcome = Outcome::rejected(
                        Some(key),
                        ErrorCode::StoreUnavailable,
                        "the operation store could not be read",
                    );
                    json!({"error": outcome_body(&outcome)}).to_string()
                }
            })
        })
    }

    /// A page of this Local's operations: `{"operations": [...], "next_after": ...}` as API v1
    /// answers it.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn operations<'env>(
        &self,
        env: &'env Env,
        status: Option<String>,
        tool: Option<String>,
        after: Option<String>,
        limit: Option<u32>,
    ) -> napi::Result<Object<'env>> {
        let app = self.app()?;
        let caller = self.caller.clone();
        let status = match status.as_deref() {
            None => None,
            Some(text) => Some(RecordStatus::parse(text).ok_or_else(|| {
                invalid(
                    "status is one of pending, awaiting_approval, applied, failed_permanent, \
                     unknown, tombstone",
                )
            })?),
        };
        let limit = limit.unwrap_or(100) as usize;
        if !(1..=500).contains(&limit) {
            return Err(invalid("limit is between 1 and 500"));
        }
        promise(env, async move {
            let filter = Filter {
                status,
                tool,
                after,
                limit,
                ..Filter::default()
            };
            let records = app.list(&caller.tenant, filter).await.map_err(|e| {
                tracing::warn!(error = %e, "listing: store unavailable");
                Error::new(
                    Status::GenericFailure,
                    "the operation store could not be read",
                )
            })?;
            let next_after = (records.len() == limit)
                .then(|| records.last().map(|r| r.key.to_string()))
                .flatten();
            Ok(json!({
                "operations": records.iter().map(views::in_process_summary).collect::<Vec<_>>(),
                "next_after": next_after,
            })
            .to_string())
        })
    }

    /// Reconciles an operation: `resolution` null looks the receipt up now; `"applied"` (with
    /// `reference` and `result`, JSON text) and `"not_applied"` record the operator's finding.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn reconcile<'env>(
        &self,
        env: &'env Env,
        key: String,
        resolution: Option<String>,
        reference: Option<String>,
        result: Option<String>,
        reason: Option<String>,
    ) -> napi::Result<Object<'env>> {
        let app = self.app()?;
        let caller = self.operator();
        let resolution = match resolution.as_deref() {
            None => None,
            Some("not_applied") => Some(Resolution::NotApplied),
            Some("applied") => {
                let reference = reference
                    .filter(|r| !r.trim().is_empty())
                    .ok_or_else(|| invalid("effectReference is empty"))?;
                let result = match result {
                    Some(text) => serde_json::from_str(&text)
                        .map_err(|e| invalid(format!("result is not JSON: {e}")))?,
                    None => Value::Null,
                };
                Some(Resolution::Applied { reference, result })
            }
            Some(_) => {
                return Err(invalid(
                    "resolution is null, \"applied\" or \"not_applied\"",
                ));
            }
        };
        let reason = reason_of(reason);
        promise(env, async move {
            let Ok(key) = OperationKey::parse(&key) else {
                return Ok(outcome_text(&no_operation()));
            };
            let outcome = app
                .reconcile(&caller, &key, resolution, &reason)
                .await
                .unwrap_or_else(|e| refused(Some(&key), e));
            Ok(outcome_text(&outcome))
        })
    }

    /// Approves an operation awaiting approval, bound to `fingerprint` when given; its effect
    /// then runs.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn approve<'env>(
        &self,
        env: &'env Env,
        key: String,
        fingerprint: Option<String>,
        reason: Option<String>,
    ) -> napi::Result<Object<'env>> {
        let app = self.app()?;
        let caller = self.operator();
        let expected = fingerprint
            .map(|f| {
                Fingerprint::parse(&f)
                    .map_err(|_| invalid("fingerprint is `sha256:` and 64 hex digits"))
            })
            .transpose()?;
        let reason = reason_of(reason);
        promise(env, async move {
            let Ok(key) = OperationKey::parse(&key) else {
                return Ok(outcome_text(&no_operation()));
            };
            let outcome = app
                .approve(&caller, &key, expected, &reason)
                .await
                .unwrap_or_else(|e| refused(Some(&key), e));
            Ok(outcome_text(&outcome))
        })
    }

    /// Denies an operation awaiting approval.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn deny<'env>(
        &self,
        env: &'env Env,
        key: String,
        reason: Option<String>,
    ) -> napi::Result<Object<'env>> {
        let app = self.app()?;
        let caller = self.operator();
        let reason = reason_of(reason);
        promise(env, async move {
            let Ok(key) = OperationKey::parse(&key) else {
                return Ok(outcome_text(&no_operation()));
            };
            let outcome = app
                .deny(&caller, &key, &reason)
                .await
                .unwrap_or_else(|e| refused(Some(&key), e));
            Ok(outcome_text(&outcome))
        })
    }

    /// Stops the recoverer and refuses every later call. Closing twice does nothing.
    #[napi(ts_return_type = "Promise<boolean>")]
    pub fn close<'env>(&self, env: &'env Env) -> napi::Result<Object<'env>> {
        self.closed.store(true, Ordering::Release);
        let recoverer = self.recoverer.clone();
        promise(env, async move {
            let background = recoverer.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(background) = background {
                background.stop().await;
            }
            Ok(true)
        })
    }

    /// Whether `close` was called.
    #[napi(getter)]
    pub fn closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The environment part of this Local's keys.
    #[napi(getter)]
    pub fn environment(&self) -> String {
        self.app.environment().to_string()
    }

    /// The tenant part of this Local's keys.
    #[napi(getter)]
    pub fn tenant(&self) -> String {
        self.caller.tenant.clone()
    }
}
