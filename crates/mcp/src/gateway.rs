//! What the MCP face needs from whoever runs the executor: the [`Gateway`] trait, and
//! [`LocalGateway`], its implementation over an in-process [`Executor`].
//!
//! The HTTP gateway implements the same trait for its own state and mounts the streamable-HTTP
//! service at `/mcp`, so both faces share one executor, one store and one set of downstreams.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use idemgate_core::contract::Contract;
use idemgate_core::effect::Downstream;
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::{ErrorCode, Outcome};
use idemgate_core::record::{Millis, Record};
use idemgate_core::store::{self, BoxFuture};
use idemgate_engine::{Caller, Executor, Operation, StatusRead, Tools};
use serde_json::Value;

/// The executor as the MCP face sees it.
///
/// `tool` is always a **contract name** (`tickets.create`), never the MCP tool name
/// (`tickets_create`): the adapter maps one to the other.
pub trait Gateway: Send + Sync + 'static {
    /// The contracts served as tools, in the order they are listed.
    fn tools(&self) -> Vec<Arc<Contract>>;

    /// One delivery of a tool call. `workflow_id` and `step_id` come from the call's `_meta`
    /// (set by the agent runtime), or are `None` when it carried none. A tool that is not
    /// served answers `rejected` / `unknown_tool`.
    fn invoke<'a>(
        &'a self,
        caller: Caller,
        tool: &'a str,
        workflow_id: Option<String>,
        step_id: Option<String>,
        arguments: Value,
    ) -> BoxFuture<'a, Outcome>;

    /// Where an operation stands, for the status tool. `None` when there is no such operation
    /// *for this caller*: an operation of another tenant answers `None` exactly as a missing
    /// one. A store failure answers `Some(rejected / store_unavailable)`.
    fn status<'a>(
        &'a self,
        caller: &'a Caller,
        key: &'a OperationKey,
    ) -> BoxFuture<'a, Option<Outcome>>;

    /// The environment part of every operation key this gateway makes.
    fn environment(&self) -> &str;

    /// The record under `key`, read for the session-window identity rule only (its creation
    /// time, tool and actor decide which key a call without `_meta` gets). Never handed to a
    /// caller: what a caller sees goes through [`Gateway::status`] and its recheck.
    fn record<'a>(
        &'a self,
        key: &'a OperationKey,
    ) -> BoxFuture<'a, Result<Option<Record>, store::Error>>;

    /// The executor's clock, which stamps each record's creation.
    fn now(&self) -> Millis;
}

/// Why a [`LocalGateway`] could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("contract `{0}` is loaded twice")]
    Duplicate(String),
    #[error("the downstream of `{tool}` could not be built: {message}")]
    Downstream { tool: String, message: String },
}

struct Tool {
    contract: Arc<Contract>,
    downstream: Arc<dyn Downstream>,
}

/// [`Gateway`] over an in-process [`Executor`]: one environment, the loaded contracts, and a
/// downstream per contract. Cheap to share behind an `Arc`.
pub struct LocalGateway {
    executor: Executor,
    environment: String,
    /// Mutable only through [`LocalGateway::serve_tool`] (`idemgate wrap`, whose child may
    /// change its tool list); read briefly, never held across an await.
    served: RwLock<Served>,
}

struct Served {
    order: Vec<Arc<Contract>>,
    tools: BTreeMap<String, Tool>,
}

impl LocalGateway {
    /// Builds each contract's downstream once with `downstream` (e.g. `HttpDownstream::
    /// from_contract`, or a fake for demos).
    pub fn new(
        executor: Executor,
        environment: impl Into<String>,
        contracts: Vec<Arc<Contract>>,
        downstream: impl Fn(&Contract) -> Result<Arc<dyn Downstream>, String>,
    ) -> Result<LocalGateway, Error> {
        let mut tools = BTreeMap::new();
        for contract in &contracts {
            let effect = downstream(contract).map_err(|message| Error::Downstream {
                tool: contract.name.clone(),
                message,
            })?;
            let previous = tools.insert(
                contract.name.clone(),
                Tool {
                    contract: contract.clone(),
                    downstream: effect,
                },
            );
            if previous.is_some() {
                return Err(Error::Duplicate(contract.name.clone()));
            }
        }
        Ok(LocalGateway {
            executor,
            environment: environment.into(),
            served: RwLock::new(Served {
                order: contracts,
                tools,
            }),
        })
    }

    /// Serves `contract` with `downstream` from now on, in place of a contract of the same
    /// name (listed at its old place) or after the others. A tool is never taken away: records
    /// of a tool the child stopped listing still resolve for status reads and recovery.
    pub fn serve_tool(&self, contract: Arc<Contract>, downstream: Arc<dyn Downstream>) {
        let mut served = self.served.write().unwrap_or_else(|e| e.into_inner());
        match served.order.iter_mut().find(|c| c.name == contract.name) {
            Some(slot) => *slot = contract.clone(),
            None => served.order.push(contract.clone()),
        }
        served.tools.insert(
            contract.name.clone(),
            Tool {
                contract,
                downstream,
            },
        );
    }

    fn resolved(&self, tool: &str) -> Option<(Arc<Contract>, Arc<dyn Downstream>)> {
        let served = self.served.read().unwrap_or_else(|e| e.into_inner());
        served
            .tools
            .get(tool)
            .map(|t| (t.contract.clone(), t.downstream.clone()))
    }

    pub fn executor(&self) -> &Executor {
        &self.executor
    }

    pub fn environment(&self) -> &str {
        &self.environment
    }
}

impl Tools for LocalGateway {
    fn resolve(&self, tool: &str) -> Option<(Arc<Contract>, Arc<dyn Downstream>)> {
        self.resolved(tool)
    }
}

fn store_down(key: &OperationKey, e: &impl std::fmt::Display) -> Outcome {
    tracing::warn!(operation_key = key.as_str(), error = %e, "status read failed");
    Outcome::rejected(
        Some(key.clone()),
        ErrorCode::StoreUnavailable,
        "the operation store could not be read",
    )
}

impl Gateway for LocalGateway {
    fn tools(&self) -> Vec<Arc<Contract>> {
        self.served
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .order
            .clone()
    }

    fn environment(&self) -> &str {
        &self.environment
    }

    fn record<'a>(
        &'a self,
        key: &'a OperationKey,
    ) -> BoxFuture<'a, Result<Option<Record>, store::Error>> {
        self.executor.store().get(key)
    }

    fn now(&self) -> Millis {
        self.executor.clock().now()
    }

    fn invoke<'a>(
        &'a self,
        caller: Caller,
        tool: &'a str,
        workflow_id: Option<String>,
        step_id: Option<String>,
        arguments: Value,
    ) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            let Some((contract, downstream)) = self.resolved(tool) else {
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
            // Detached: a host that cancels the call (or closes the stream) stops waiting; the
            // claimed execution runs to a settled state on its own task.
            self.executor
                .execute_detached(contract, operation, Arc::new(arguments), downstream)
                .await
        })
    }

    fn status<'a>(
        &'a self,
        caller: &'a Caller,
        key: &'a OperationKey,
    ) -> BoxFuture<'a, Option<Outcome>> {
        Box::pin(async move {
            // Tenant-scoped: another tenant's key is indistinguishable from a missing one. This
            // gateway serves one environment, so another environment's key is not found either.
            if key.tenant() != caller.tenant || key.environment() != self.environment {
                return None;
            }
            // The record names its tool; with the tool's contract and downstream, the status
            // read also polls an accepted job, so polling here finishes it.
            let record = match self.executor.store().get(key).await {
                Ok(Some(record)) => record,
                Ok(None) => return None,
                Err(e) => return Some(store_down(key, &e)),
            };
            let tool = self.resolved(&record.tool);
            let contract = tool.as_ref().map(|(c, _)| c.as_ref());
            let effect = tool.as_ref().map(|(_, d)| d.as_ref());
            // The stored result is handed out like a replay: the caller is rechecked first.
            match self.executor.status(contract, key, effect, caller).await {
                Ok(Some(StatusRead::Found { outcome, .. } | StatusRead::Denied(outcome))) => {
                    Some(outcome)
                }
                Ok(None) => None,
                Err(e) => Some(store_down(key, &e)),
            }
        })
    }
}
