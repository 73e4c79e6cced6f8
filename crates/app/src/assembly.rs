//! The assembly itself: a store and the tools → the executor (its authorizer the tools' own
//! routing) → the recoverer, and what every face does with the result: one delivery of a tool
//! call ([`App::invoke`], or [`App::invoke_waiting`] for a caller that waits for an in-flight
//! operation to settle), and the reads of an operation for its caller ([`App::status`],
//! [`App::operation`], [`App::record`] for an operator's action, [`App::list`] and
//! [`App::waiting`] for the queues) — whose tenant and environment scope is decided here, in
//! [`App::owns`] for a key and by these listings for a page.

use std::sync::Arc;
use std::time::Duration;

use idemgate_core::clock::{Clock, SystemClock};
use idemgate_core::effect::Downstream;
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::{ErrorCode, Outcome};
use idemgate_core::record::Record;
use idemgate_core::store::{self, Filter, Store, Waiting, WaitingOn};
use idemgate_engine::{Caller, Executor, Observer, Operation, Recoverer, Settings, StatusRead};
use serde_json::Value;

use crate::tools::ToolSet;

/// How often the recoverer looks for due records, and how often it sweeps retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recovery {
    pub every: Duration,
    pub sweep_every: Duration,
}

impl Default for Recovery {
    /// The local faces' defaults (`idemgate mcp`, `idemgate wrap`); `serve` reads its own from
    /// `[recovery]`.
    fn default() -> Self {
        Recovery {
            every: Duration::from_secs(2),
            sweep_every: Duration::from_secs(300),
        }
    }
}

/// Puts an [`App`] together: the store and the tools, and optionally a clock, executor
/// settings, an observer, recovery intervals, and wrappers around the store and the
/// downstreams (the HTTP gateway's metrics).
pub struct Assembly {
    store: Arc<dyn Store>,
    tools: ToolSet,
    environment: String,
    clock: Arc<dyn Clock>,
    settings: Settings,
    observer: Option<Arc<dyn Observer>>,
    recovery: Recovery,
    key_part_bytes: usize,
}

/// The longest `workflow_id` or `step_id` a caller may name unless configured otherwise, in
/// bytes (the joined key is bounded to 255 bytes as well).
pub const DEFAULT_KEY_PART_BYTES: usize = 128;

impl Assembly {
    pub fn new(store: Arc<dyn Store>, tools: ToolSet, environment: impl Into<String>) -> Assembly {
        Assembly {
            store,
            tools,
            environment: environment.into(),
            clock: Arc::new(SystemClock),
            settings: Settings::default(),
            observer: None,
            recovery: Recovery::default(),
            key_part_bytes: DEFAULT_KEY_PART_BYTES,
        }
    }

    /// The longest `workflow_id` or `step_id` a caller may name, in bytes (every face: API
    /// v1's `[limits] key_part_bytes`).
    pub fn key_part_bytes(mut self, max: usize) -> Assembly {
        self.key_part_bytes = max;
        self
    }

    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Assembly {
        self.clock = clock;
        self
    }

    pub fn environment(mut self, environment: impl Into<String>) -> Assembly {
        self.environment = environment.into();
        self
    }

    pub fn settings(mut self, settings: Settings) -> Assembly {
        self.settings = settings;
        self
    }

    pub fn observer(mut self, observer: Arc<dyn Observer>) -> Assembly {
        self.observer = Some(observer);
        self
    }

    pub fn recovery(mut self, recovery: Recovery) -> Assembly {
        self.recovery = recovery;
        self
    }

    /// Puts a wrapper around the store (metrics).
    pub fn wrap_store(mut self, wrap: impl FnOnce(Arc<dyn Store>) -> Arc<dyn Store>) -> Assembly {
        self.store = wrap(self.store);
        self
    }

    /// Puts a wrapper around every tool's downstream (timing).
    pub fn map_downstreams(
        mut self,
        f: impl Fn(&str, Arc<dyn Downstream>) -> Arc<dyn Downstream>,
    ) -> Assembly {
        self.tools = self.tools.map_downstreams(f);
        self
    }

    /// The executor over the store, whose one authorizer is the tools' routing to each
    /// tool's hook.
    pub fn build(self) -> App {
        let tools = Arc::new(self.tools);
        let mut executor = Executor::new(self.store, self.clock, tools.clone(), self.settings);
        if let Some(observer) = self.observer {
            executor = executor.with_observer(observer);
        }
        App {
            executor,
            tools,
            environment: self.environment,
            recovery: self.recovery,
            key_part_bytes: self.key_part_bytes,
        }
    }
}

/// The assembled application: one executor serving one environment's tools. Cheap to clone;
/// every face holds one.
#[derive(Clone)]
pub struct App {
    executor: Executor,
    tools: Arc<ToolSet>,
    environment: String,
    recovery: Recovery,
    key_part_bytes: usize,
}

fn store_down(key: &OperationKey, e: &dyn std::fmt::Display) -> Outcome {
    tracing::warn!(operation_key = key.as_str(), error = %e, "status read failed");
    Outcome::rejected(
        Some(key.clone()),
        ErrorCode::StoreUnavailable,
        "the operation store could not be read",
    )
}

impl App {
    pub fn executor(&self) -> &Executor {
        &self.executor
    }

    /// The registry; [`ToolSet::serve`] adds a tool while the app runs.
    pub fn tools(&self) -> &Arc<ToolSet> {
        &self.tools
    }

    /// The environment part of every operation key this app makes.
    pub fn environment(&self) -> &str {
        &self.environment
    }

    pub fn recovery(&self) -> Recovery {
        self.recovery
    }

    /// The background recoverer over this app's executor and tools.
    pub fn recoverer(&self) -> Recoverer {
        Recoverer::new(
            self.executor.clone(),
            self.tools.clone(),
            self.environment.clone(),
        )
    }

    /// Starts the recoverer (abandoned claims, jobs due for a poll, expiries) and the
    /// retention sweeper at the app's intervals, on a task of their own until
    /// [`Background::stop`].
    pub fn start_recoverer(&self) -> Background {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let run =
            self.recoverer()
                .run(self.recovery.every, self.recovery.sweep_every, async move {
                    let _ = stopped.wait_for(|s| *s).await;
                });
        Background {
            stop,
            task: tokio::spawn(run),
        }
    }

    /// The longest `workflow_id` or `step_id` a caller may name, in bytes.
    pub fn key_part_bytes(&self) -> usize {
        self.key_part_bytes
    }

    /// One delivery of a call of `tool` (a contract name). `workflow_id` and `step_id` name
    /// the operation, or are `None` when the caller named none. A tool that is not served
    /// answers `rejected` / `unknown_tool`.
    pub async fn invoke(
        &self,
        caller: Caller,
        tool: &str,
        workflow_id: Option<String>,
        step_id: Option<String>,
        arguments: Value,
    ) -> Outcome {
        self.invoke_waiting(caller, tool, workflow_id, step_id, arguments, None)
            .await
    }

    /// [`App::invoke`] for a caller that waits up to `wait` for an in-flight operation (its
    /// own, or another delivery's) to settle before the answer, instead of polling.
    pub async fn invoke_waiting(
        &self,
        caller: Caller,
        tool: &str,
        workflow_id: Option<String>,
        step_id: Option<String>,
        arguments: Value,
        wait: Option<Duration>,
    ) -> Outcome {
        self.deliver(caller, tool, workflow_id, step_id, arguments, wait, false)
            .await
    }

    /// [`App::invoke_waiting`] for a caller that awaits the future to its end whatever happens —
    /// a thread blocked on it (a synchronous in-process call), or a task of its own that
    /// nothing aborts (a promise's, in Node) — so the delivery runs on the caller's own task
    /// instead of one of its own ([`Executor::execute_here`]), sparing a task and the hand-offs
    /// to it and back per call. A future that may be dropped early (an HTTP request's, a
    /// cancellable awaitable's) uses [`App::invoke_waiting`]: dropping this one mid-way would
    /// stop the delivery.
    pub async fn invoke_awaited(
        &self,
        caller: Caller,
        tool: &str,
        workflow_id: Option<String>,
        step_id: Option<String>,
        arguments: Value,
        wait: Option<Duration>,
    ) -> Outcome {
        self.deliver(caller, tool, workflow_id, step_id, arguments, wait, true)
            .await
    }

    #[allow(clippy::too_many_arguments)] // the invocation's parts, one each
    async fn deliver(
        &self,
        caller: Caller,
        tool: &str,
        workflow_id: Option<String>,
        step_id: Option<String>,
        arguments: Value,
        wait: Option<Duration>,
        here: bool,
    ) -> Outcome {
        let Some(tool) = self.tools.get(tool) else {
            let message = format!("no tool `{tool}` is served here");
            return self
                .refuse(
                    caller,
                    workflow_id,
                    step_id,
                    ErrorCode::UnknownTool,
                    message,
                )
                .await;
        };
        // The same bounds on the operation's parts whichever face carried the call.
        for (name, part) in [("workflow_id", &workflow_id), ("step_id", &step_id)] {
            if let Some(part) = part
                && let Err(message) = check_part(name, part, self.key_part_bytes)
            {
                return Outcome::rejected(None, ErrorCode::InvalidOperationKey, message);
            }
        }
        let operation = Operation {
            caller,
            environment: self.environment.clone(),
            workflow_id,
            step_id,
        };
        let arguments = Arc::new(arguments);
        // Detached: a caller that stops waiting (a cancelled call, a closed stream) does not
        // stop the effect; the claimed execution runs to a settled state on its own task.
        match wait {
            Some(wait) if !wait.is_zero() => {
                self.executor
                    .execute_waiting(
                        tool.contract,
                        operation,
                        arguments,
                        tool.downstream,
                        wait,
                        here,
                    )
                    .await
            }
            Some(_) | None if here => {
                self.executor
                    .execute_here(
                        &tool.contract,
                        &operation,
                        &arguments,
                        tool.downstream.as_ref(),
                    )
                    .await
            }
            Some(_) | None => {
                self.executor
                    .execute_detached(tool.contract, operation, arguments, tool.downstream)
                    .await
            }
        }
    }

    /// [`App::invoke`]'s answer when memory alone gives it: the replay of a settled record the
    /// executor keeps, of a tool whose replays ask no hook
    /// ([`Executor::replay_from_memory`]). `None` for anything else, which [`App::invoke`] then
    /// delivers whole. Reads no store and spawns no task, so an in-process face calls it on the
    /// caller's own thread first.
    pub fn replay_from_memory(
        &self,
        caller: &Caller,
        tool: &str,
        workflow_id: Option<&str>,
        step_id: Option<&str>,
        arguments: &Value,
    ) -> Option<Outcome> {
        let (Some(workflow_id), Some(step_id)) = (workflow_id, step_id) else {
            return None;
        };
        for (name, part) in [("workflow_id", workflow_id), ("step_id", step_id)] {
            check_part(name, part, self.key_part_bytes).ok()?;
        }
        let tool = self.tools.get(tool)?;
        let operation = Operation {
            caller: caller.clone(),
            environment: self.environment.clone(),
            workflow_id: Some(workflow_id.to_owned()),
            step_id: Some(step_id.to_owned()),
        };
        self.executor.replay_from_memory(
            &tool.contract,
            &operation,
            arguments,
            tool.downstream.as_ref(),
        )
    }

    /// The machine's answer to a delivery a face refuses before the executor runs it (a body
    /// too large, malformed, or with members it does not take; a tool that is not served), once
    /// the delivery named its operation: the key is read, and the refusal says
    /// `safe_to_repeat` only if the key provably had no effect. A delivery that named no
    /// operation (or no valid one) proves nothing happened under any key. A face that could not
    /// read what was delivered far enough to know whether it named one has no proof at all, and
    /// refuses with `Outcome::rejected` (`safe_to_repeat: false`).
    pub async fn refuse(
        &self,
        caller: Caller,
        workflow_id: Option<String>,
        step_id: Option<String>,
        code: ErrorCode,
        message: impl Into<String>,
    ) -> Outcome {
        let mut named = true;
        for part in [&workflow_id, &step_id].into_iter().flatten() {
            named &= check_part("part", part, self.key_part_bytes).is_ok();
        }
        let operation = Operation {
            caller,
            environment: self.environment.clone(),
            workflow_id: workflow_id.filter(|_| named),
            step_id: step_id.filter(|_| named),
        };
        self.executor.refuse(&operation, code, message).await
    }

    /// Whether `key` is an operation `tenant`'s callers may read or act on here: their own
    /// tenant's, in this app's environment. **The one place** a read's scope is decided: every
    /// face's reads go through it ([`App::record`], [`App::operation`], [`App::status`]), so
    /// another tenant's or another environment's key is not found, exactly as a missing one.
    pub fn owns(&self, tenant: &str, key: &OperationKey) -> bool {
        key.tenant() == tenant && key.environment() == self.environment
    }

    /// The record under `key` if `tenant` may see it ([`App::owns`]): for an operator's action,
    /// which goes through the executor's operator paths, and for reads that show no stored
    /// result. `None` for another tenant's or environment's key, exactly as a missing one.
    pub async fn record(
        &self,
        tenant: &str,
        key: &OperationKey,
    ) -> Result<Option<Record>, store::Error> {
        if !self.owns(tenant, key) {
            return Ok(None);
        }
        self.executor.store().get(key).await
    }

    /// A page of `tenant`'s operations in this environment, as `filter` selects them otherwise
    /// (status, tool, keyset position, limit): the filter's tenant and environment are this
    /// scope's, whatever it said.
    pub async fn list(&self, tenant: &str, filter: Filter) -> Result<Vec<Record>, store::Error> {
        self.executor
            .store()
            .list(Filter {
                tenant: Some(tenant.to_string()),
                environment: Some(self.environment.clone()),
                ..filter
            })
            .await
    }

    /// A page of `tenant`'s operations in this environment waiting `on` something (a lease
    /// past its end, a job in progress), by key after `after`: the console's queues.
    pub async fn waiting(
        &self,
        tenant: &str,
        on: WaitingOn,
        tool: Option<String>,
        after: Option<String>,
        limit: usize,
    ) -> Result<Vec<Record>, store::Error> {
        self.executor
            .store()
            .waiting(Waiting {
                tenant: tenant.to_string(),
                environment: self.environment.clone(),
                on,
                tool,
                after,
                limit,
            })
            .await
    }

    /// Where an operation stands for its caller, with the record it was read from: the
    /// stored result is handed out like a replay, so the caller is rechecked first
    /// ([`StatusRead::Denied`]). With the record's tool loaded, reading the status polls an
    /// accepted job, so polling here finishes it. `None` when there is no such operation for
    /// this caller.
    pub async fn operation(
        &self,
        caller: &Caller,
        key: &OperationKey,
    ) -> Result<Option<StatusRead>, store::Error> {
        let Some(record) = self.record(&caller.tenant, key).await? else {
            return Ok(None);
        };
        let tool = self.tools.get(&record.tool);
        self.executor
            .status(
                tool.as_ref().map(|t| t.contract.as_ref()),
                key,
                tool.as_ref().map(|t| t.downstream.as_ref()),
                caller,
            )
            .await
    }

    /// Where an operation stands, for its caller: [`App::operation`]'s outcome. A store
    /// failure answers `rejected` / `store_unavailable`.
    pub async fn status(&self, caller: &Caller, key: &OperationKey) -> Option<Outcome> {
        match self.operation(caller, key).await {
            Ok(Some(StatusRead::Found { outcome, .. } | StatusRead::Denied(outcome))) => {
                Some(outcome)
            }
            Ok(None) => None,
            Err(e) => Some(store_down(key, &e)),
        }
    }
}

/// Bounds one caller-supplied key part. Its characters are checked by `OperationKey`.
pub fn check_part(part: &str, value: &str, max: usize) -> Result<(), String> {
    if value.is_empty() {
        return Err(format!("{part} is empty"));
    }
    if value.len() > max {
        return Err(format!(
            "{part} is {} bytes long; at most {max} are allowed",
            value.len()
        ));
    }
    if value.contains(':') {
        return Err(format!(
            "{part} contains `:`, which separates the parts of an operation key"
        ));
    }
    Ok(())
}

/// The recoverer running in the background; stopped by [`Background::stop`].
pub struct Background {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Background {
    /// Asks the recoverer to stop and waits until it has.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}
