//! The assembly itself: a store and the tools → the executor (its authorizer the tools' own
//! routing) → the recoverer, and the two things every face does with the result: one
//! delivery of a tool call ([`App::invoke`]) and the status of an operation for its caller
//! ([`App::status`]).

use std::sync::Arc;
use std::time::Duration;

use idemgate_core::clock::{Clock, SystemClock};
use idemgate_core::effect::Downstream;
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::{ErrorCode, Outcome};
use idemgate_core::store::Store;
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
}

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
        }
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
        let Some(tool) = self.tools.get(tool) else {
            return Outcome::rejected(
                None,
                ErrorCode::UnknownTool,
                format!("no tool `{tool}` is served here"),
            );
        };
        let operation = Operation {
            caller,
            environment: self.environment.clone(),
            workflow_id,
            step_id,
        };
        // Detached: a caller that stops waiting (a cancelled call, a closed stream) does not
        // stop the effect; the claimed execution runs to a settled state on its own task.
        self.executor
            .execute_detached(
                tool.contract,
                operation,
                Arc::new(arguments),
                tool.downstream,
            )
            .await
    }

    /// Where an operation stands, for its caller. `None` when there is no such operation
    /// *for this caller*: another tenant's or another environment's key answers `None`
    /// exactly as a missing one. A store failure answers `rejected` / `store_unavailable`.
    pub async fn status(&self, caller: &Caller, key: &OperationKey) -> Option<Outcome> {
        if key.tenant() != caller.tenant || key.environment() != self.environment {
            return None;
        }
        let record = match self.executor.store().get(key).await {
            Ok(Some(record)) => record,
            Ok(None) => return None,
            Err(e) => return Some(store_down(key, &e)),
        };
        // With the record's tool, reading the status polls an accepted job, so polling here
        // finishes it.
        let tool = self.tools.get(&record.tool);
        // The stored result is handed out like a replay: the caller is rechecked first.
        match self
            .executor
            .status(
                tool.as_ref().map(|t| t.contract.as_ref()),
                key,
                tool.as_ref().map(|t| t.downstream.as_ref()),
                caller,
            )
            .await
        {
            Ok(Some(StatusRead::Found { outcome, .. } | StatusRead::Denied(outcome))) => {
                Some(outcome)
            }
            Ok(None) => None,
            Err(e) => Some(store_down(key, &e)),
        }
    }
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
