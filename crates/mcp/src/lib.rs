//! idemgate's MCP face: every tool contract becomes an MCP tool, served over stdio and
//! streamable HTTP, and every call goes through the executor.
//!
//! Reading order:
//!
//! - [`Gateway`] — what this face needs from whoever runs the executor: the contracts,
//!   `invoke` one delivery, `status` of an operation for the caller's tenant. The one
//!   application assembly, [`idemgate_app::App`], implements it, for every transport: stdio
//!   here, and streamable HTTP wherever `idemgate serve` mounts [`streamable_http_service_with`].
//! - [`tools`] — the mapping as plain data: contract ⇒ tool name, description, schemas and
//!   annotations; `_meta` ⇒ operation identity; outcome ⇒ result with one sentence for the model.
//! - [`identity`] — keys for hosts that cannot send `_meta` (the `session_window` rule and
//!   `repeat_of`), as plain functions.
//! - [`adapter`] — **the only module that knows the MCP SDK** (`rmcp`): the server handler,
//!   [`serve_stdio`], and [`streamable_http_service`] to mount at `/mcp`.
//! - [`fake`] — per-contract fake downstreams and their hidden control tool, for
//!   `idemgate mcp --fake-downstream`.
//! - [`wrapped`] — `idemgate wrap`: a child MCP server's tools as it lists them, its other
//!   requests passed through ([`wrapped::Passthrough`]).
//! - [`assembly`] — the local faces over stdio (`idemgate mcp`, `idemgate wrap`): the one
//!   local caller ([`assembly::Local`]) and [`assembly::serve_stdio`], which runs the app's
//!   recoverer while it serves; [`assembly::serve_config`] is `idemgate mcp --config`, the
//!   configuration file's app over stdio. Flags are the binary's (`crates/cli`); the app is
//!   assembled by `idemgate_app`.
//! - [`config`] — this face's section of the configuration file, `[mcp]`.
//!
//! The operation key is never the model's: the agent runtime names the operation in the call's
//! `_meta` (`"io.idemgate/operation": {"workflow_id", "step_id"}`) — or, under the
//! `session_window` rule, idemgate derives it — the tenant comes from the caller's credentials
//! (stdio: configuration), the environment from the server.

pub mod adapter;
pub mod assembly;
pub mod config;
pub mod fake;
pub mod gateway;
pub mod identity;
pub mod tools;
pub mod wrapped;

pub use adapter::{
    HttpOptions, McpHttpService, Options, serve_io, serve_stdio, streamable_http_service,
    streamable_http_service_with,
};
pub use gateway::Gateway;
