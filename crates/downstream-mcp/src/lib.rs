//! idemgate's MCP downstream: a child MCP server over stdio, each of its tool calls one
//! effect. This is what `idemgate wrap -- <command>` runs behind the executor.
//!
//! Reading order:
//!
//! - [`child`] — **the one module that knows the MCP SDK's client side** (`rmcp` with its
//!   child-process transport): [`Child::start`] spawns, initialises and lists the tools;
//!   [`Child::call_tool`] makes one call, classified as [`CallAnswer`]; a call that finds the
//!   child dead starts it again (bounded backoff) and tells the new process the log level
//!   and subscriptions the host set; [`Child::forward`] passes resources, prompts,
//!   completion, subscription and log-level requests through.
//! - [`relay`] — everything else between the child and the host, as plain JSON: the child's
//!   notifications and requests (sampling, elicitation, roots) for the host ([`Upstream`]),
//!   progress mapped from the child's request to the host's by operation key, and tool-list
//!   changes.
//! - [`downstream`] — [`McpDownstream`], one tool as the core's `Downstream`: `perform` is one
//!   `tools/call`; no receipt lookup, no deduplication, so a lost answer is ambiguous and the
//!   executor ends it `unknown` (the contract's dispatch marker makes recovery say so too).
//! - [`defaults`] — the contract of a tool without a contract file, from its annotations.
//!
//! What the child proves: an answer (even `isError: true`) is a definite answer and is
//! recorded and replayed; a death, a hang past the timeout or a malformed answer mid-call
//! proves nothing and is ambiguous; a child that cannot be started proves nothing was sent.

pub mod child;
pub mod defaults;
pub mod downstream;
pub mod relay;

pub use child::{CallAnswer, Child, ChildSpec, ForwardError, StartError, Started};
pub use defaults::{Annotations, default_contract};
pub use downstream::{DEFAULT_MAX_ARGUMENT_BYTES, McpDownstream, OPERATION_KEY_META};
pub use relay::{Relay, RouteGuard, Upstream};
