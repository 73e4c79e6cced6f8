//! What the MCP face needs from whoever runs the executor: the [`Gateway`] trait, and its
//! implementation over the one application assembly, [`idemgate_app::App`] — for `idemgate
//! mcp`, `idemgate wrap`, and `/mcp` of `idemgate serve`, which mounts the streamable-HTTP
//! service over the same `App` as API v1, so both faces share one executor, one store and one
//! set of downstreams.

use std::sync::Arc;

use idemgate_app::App;
use idemgate_core::contract::Contract;
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::Outcome;
use idemgate_core::record::{Millis, Record};
use idemgate_core::store::{self, BoxFuture};
use idemgate_engine::Caller;
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

    /// The record under `key` if it is `tenant`'s in this environment (`None` otherwise, as a
    /// missing one), read for the session-window identity rule and a task's times only (its
    /// creation time, tool and actor decide which key a call without `_meta` gets). Never
    /// handed to a caller: what a caller sees goes through [`Gateway::status`] and its recheck.
    fn record<'a>(
        &'a self,
        tenant: &'a str,
        key: &'a OperationKey,
    ) -> BoxFuture<'a, Result<Option<Record>, store::Error>>;

    /// The executor's clock, which stamps each record's creation.
    fn now(&self) -> Millis;
}

impl Gateway for App {
    fn tools(&self) -> Vec<Arc<Contract>> {
        App::tools(self).contracts()
    }

    fn environment(&self) -> &str {
        App::environment(self)
    }

    fn record<'a>(
        &'a self,
        tenant: &'a str,
        key: &'a OperationKey,
    ) -> BoxFuture<'a, Result<Option<Record>, store::Error>> {
        Box::pin(App::record(self, tenant, key))
    }

    fn now(&self) -> Millis {
        self.executor().clock().now()
    }

    fn invoke<'a>(
        &'a self,
        caller: Caller,
        tool: &'a str,
        workflow_id: Option<String>,
        step_id: Option<String>,
        arguments: Value,
    ) -> BoxFuture<'a, Outcome> {
        Box::pin(App::invoke(
            self,
            caller,
            tool,
            workflow_id,
            step_id,
            arguments,
        ))
    }

    fn status<'a>(
        &'a self,
        caller: &'a Caller,
        key: &'a OperationKey,
    ) -> BoxFuture<'a, Option<Outcome>> {
        // Tenant-scoped: another tenant's key is indistinguishable from a missing one. The app
        // serves one environment, so another environment's key is not found either.
        Box::pin(App::status(self, caller, key))
    }
}
