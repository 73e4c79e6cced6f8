//! The child MCP server: started over stdio, initialised, asked for its tools, called, and
//! started again after it dies.
//!
//! **The one module of this crate that knows the MCP SDK** (`rmcp`, client side, with its
//! child-process transport). Everything it hands out is plain JSON, so the MCP face and the
//! downstream never see the SDK's client types.

// Sampling, roots and logging are deprecated by the 2026-07-28 revision (SEP-2577); wrap
// speaks the handshake revision to its child, where they are current, and passes them on.
#![allow(deprecated)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CancelledNotificationParam, ClientCapabilities,
    ClientConfig, ClientRequest, CreateMessageRequestParams, CreateMessageResult,
    ElicitRequestParams, ElicitResult, Implementation, JsonObject, ListRootsResult,
    LoggingMessageNotificationParam, ProgressNotificationParam, Request, RequestMetaObject,
    ResourceUpdatedNotificationParam, ServerResult,
};
use rmcp::service::{
    NotificationContext, Peer, PeerRequestOptions, RequestContext, RunningService, ServiceError,
};
use rmcp::transport::TokioChildProcess;
use rmcp::{ClientHandler, ErrorData, RoleClient, ServiceExt};
use serde_json::{Map, Value, json};
use tokio::process::Command;
use tokio::sync::Mutex;

use crate::relay::{self, Relay};

/// How to run the child, and how long to wait for it.
#[derive(Debug, Clone)]
pub struct ChildSpec {
    pub program: String,
    pub args: Vec<String>,
    /// From spawning to the answer of `initialize` and the first `tools/list`.
    pub start_timeout: Duration,
    /// One `tools/call`; past it the call's outcome is unknown.
    pub call_timeout: Duration,
    /// The longest wait between two restarts of a child that keeps dying.
    pub max_backoff: Duration,
}

impl ChildSpec {
    pub fn new(program: impl Into<String>, args: Vec<String>) -> ChildSpec {
        ChildSpec {
            program: program.into(),
            args,
            start_timeout: Duration::from_secs(30),
            call_timeout: Duration::from_secs(60),
            max_backoff: Duration::from_secs(30),
        }
    }

    /// The command line as people wrote it, for messages: `python child.py`.
    pub fn display(&self) -> String {
        std::iter::once(self.program.as_str())
            .chain(self.args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Why the child could not be started (or started again).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    #[error("the child MCP server `{child}` could not be started: {message}")]
    Spawn { child: String, message: String },
    #[error(
        "the child `{child}` is not an MCP server, or exited at start: its stdout closed or did not answer `initialize` ({message})"
    )]
    NotMcp { child: String, message: String },
    #[error("the child MCP server `{child}` did not answer `{step}` within {seconds} s")]
    Timeout {
        child: String,
        step: &'static str,
        seconds: u64,
    },
    #[error("the child MCP server `{child}` failed to list its tools: {message}")]
    Tools { child: String, message: String },
}

/// What the child said about itself at start: plain JSON from its `initialize` answer and
/// `tools/list`.
#[derive(Debug, Clone)]
pub struct Started {
    /// Every tool, as the child listed it (`name`, `inputSchema`, `annotations`, …).
    pub tools: Vec<Map<String, Value>>,
    /// The child's `capabilities` object.
    pub capabilities: Value,
    /// The child's `serverInfo` object.
    pub server_info: Value,
    pub instructions: Option<String>,
}

/// The answer to one `tools/call`, classified by what it proves.
#[derive(Debug, Clone, PartialEq)]
pub enum CallAnswer {
    /// The child answered: the result as JSON (`content`, `structuredContent`, `isError`).
    Answered(Map<String, Value>),
    /// Nothing was sent: the child is down and could not be started again.
    NotSent(String),
    /// The request may have reached the child and its answer is lost: it died, hung past the
    /// timeout, or answered something that is not a tool result.
    Ambiguous(String),
}

/// The child's answer to a request passed through (resources, prompts, completion).
#[derive(Debug, Clone, PartialEq)]
pub struct ForwardError {
    /// A JSON-RPC error code (the child's own, or -32603 when it could not be asked).
    pub code: i32,
    pub message: String,
    pub data: Option<Value>,
}

type Connection = RunningService<RoleClient, Handler>;

/// The client side of one connection to the child: its notifications and requests to the
/// host go through the [`Relay`].
#[derive(Clone)]
struct Handler {
    relay: Arc<Relay>,
}

fn to_error(e: ForwardError) -> ErrorData {
    ErrorData::new(rmcp::model::ErrorCode(e.code), e.message, e.data)
}

impl Handler {
    /// One request of the child for the host, read back as the SDK's answer type.
    async fn ask<P: serde::Serialize, T: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        params: P,
    ) -> Result<T, ErrorData> {
        let params = serde_json::to_value(params).unwrap_or(Value::Null);
        let answer = self.relay.ask(method, params).await.map_err(to_error)?;
        serde_json::from_value(answer).map_err(|e| {
            ErrorData::internal_error(format!("the host's answer to `{method}`: {e}"), None)
        })
    }

    fn pass<P: serde::Serialize>(&self, method: &str, params: P) {
        let params = serde_json::to_value(params).unwrap_or(Value::Null);
        self.relay.notify(method, params);
    }
}

impl ClientHandler for Handler {
    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        self.ask("sampling/createMessage", params).await
    }

    async fn list_roots(
        &self,
        _context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        self.ask("roots/list", json!({})).await
    }

    async fn create_elicitation(
        &self,
        params: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        self.ask("elicitation/create", params).await
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.relay
            .progress(serde_json::to_value(params).unwrap_or(Value::Null));
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.pass("notifications/message", params);
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.pass("notifications/resources/updated", params);
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.pass("notifications/resources/list_changed", json!({}));
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.pass("notifications/prompts/list_changed", json!({}));
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.relay.tools_changed();
    }

    fn get_info(&self) -> ClientConfig {
        client_config()
    }
}

struct State {
    connection: Option<Connection>,
    /// Starts that failed in a row, for the backoff.
    failures: u32,
    /// Not before this instant may the next start be tried.
    not_before: Option<Instant>,
    /// Grows with every connection, so that a call that saw its connection break drops that
    /// one and not a newer one.
    generation: u64,
}

/// One child MCP server, shared by every tool it offers. A call that finds it dead starts it
/// again, no sooner than the backoff allows (0.4 s doubling up to `max_backoff`).
pub struct Child {
    spec: ChildSpec,
    state: Mutex<State>,
    relay: Arc<Relay>,
}

impl std::fmt::Debug for Child {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Child")
            .field("command", &self.spec.display())
            .finish_non_exhaustive()
    }
}

fn client_config() -> ClientConfig {
    let capabilities: ClientCapabilities =
        serde_json::from_value(relay::child_capabilities()).unwrap_or_default();
    ClientConfig::new(
        capabilities,
        Implementation::new("idemgate-wrap", env!("CARGO_PKG_VERSION")),
    )
}

impl Child {
    /// Starts the child, initialises it and lists its tools. Fails with an error naming the
    /// child when it cannot be spawned, is not an MCP server, exits at start, or is too slow.
    pub async fn start(spec: ChildSpec) -> Result<(Arc<Child>, Started), StartError> {
        let relay = Relay::new(spec.display());
        let connection = connect(&spec, &relay).await?;
        let started = describe(&spec, &connection).await?;
        let child = Arc::new(Child {
            spec,
            state: Mutex::new(State {
                connection: Some(connection),
                failures: 0,
                not_before: None,
                generation: 0,
            }),
            relay,
        });
        Ok((child, started))
    }

    pub fn spec(&self) -> &ChildSpec {
        &self.spec
    }

    /// What passes between the child and the host besides tool calls.
    pub fn relay(&self) -> &Arc<Relay> {
        &self.relay
    }

    /// The child's tools as it lists them now (starting it again if it died).
    pub async fn list_tools(&self) -> Result<Vec<Map<String, Value>>, String> {
        let (peer, _) = self.peer().await?;
        let child = self.spec.display();
        let listed = tokio::time::timeout(self.spec.start_timeout, peer.list_all_tools())
            .await
            .map_err(|_| {
                format!(
                    "the child MCP server `{child}` did not answer `tools/list` within {} s",
                    self.spec.start_timeout.as_secs()
                )
            })?
            .map_err(|e| format!("the child MCP server `{child}` failed to list its tools: {e}"))?;
        Ok(tools_as_json(&listed))
    }

    /// One notification of the host for the child: `notifications/roots/list_changed`.
    /// Dropped while the child is down: a child started again asks for what it needs.
    pub async fn notify(&self, method: &str) {
        let peer = {
            let state = self.state.lock().await;
            state.connection.as_ref().map(|c| c.peer().clone())
        };
        let (Some(peer), "notifications/roots/list_changed") = (peer, method) else {
            return;
        };
        if let Err(e) = peer.notify_roots_list_changed().await {
            tracing::debug!(child = %self.spec.display(), error = %e, "roots/list_changed not delivered");
        }
    }

    /// A live connection: the current one, or a new child when it died. `Err` when the child
    /// could not be started (or the backoff says not yet).
    async fn peer(&self) -> Result<(Peer<RoleClient>, u64), String> {
        let mut state = self.state.lock().await;
        if let Some(c) = &state.connection
            && !c.is_closed()
            && !c.peer().is_transport_closed()
        {
            return Ok((c.peer().clone(), state.generation));
        }
        if state.connection.take().is_some() {
            tracing::warn!(child = %self.spec.display(), "the child MCP server ended; starting it again");
        }
        if let Some(at) = state.not_before
            && Instant::now() < at
        {
            return Err(format!(
                "the child MCP server `{}` is down; the next start is due in {} ms",
                self.spec.display(),
                at.duration_since(Instant::now()).as_millis()
            ));
        }
        match connect(&self.spec, &self.relay).await {
            Ok(connection) => {
                let peer = connection.peer().clone();
                state.connection = Some(connection);
                state.failures = 0;
                state.not_before = None;
                state.generation += 1;
                // A new process may list other tools than the one that died.
                self.relay.tools_changed();
                Ok((peer, state.generation))
            }
            Err(e) => {
                state.failures = state.failures.saturating_add(1);
                state.not_before =
                    Some(Instant::now() + backoff(state.failures, self.spec.max_backoff));
                Err(e.to_string())
            }
        }
    }

    /// One `tools/call`. `meta` goes to the child as the request's `_meta`.
    pub async fn call_tool(
        &self,
        name: &str,
        arguments: Map<String, Value>,
        meta: Map<String, Value>,
    ) -> CallAnswer {
        let (peer, generation) = match self.peer().await {
            Ok(peer) => peer,
            Err(message) => return CallAnswer::NotSent(message),
        };
        let arguments_value = Value::Object(arguments.clone());
        let mut params = CallToolRequestParams::new(name.to_string()).with_arguments(arguments);
        if !meta.is_empty() {
            params.meta = Some(RequestMetaObject::from(meta));
        }
        let child = self.spec.display();
        let seconds = self.spec.call_timeout.as_secs();
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let sent = peer
            .send_request_with_option(request, PeerRequestOptions::no_options())
            .await;
        let answer = match sent {
            Ok(handle) => {
                // The SDK gives every request its own progress token: progress under it is
                // passed to the host's request that announced this call, if one waits.
                let token = serde_json::to_value(&handle.progress_token).unwrap_or(Value::Null);
                self.relay.claim(name, &arguments_value, token);
                let id = handle.id.clone();
                match tokio::time::timeout(self.spec.call_timeout, handle.await_response()).await {
                    Ok(answer) => Ok(answer),
                    Err(elapsed) => {
                        // Past the timeout the child is told to stop; whether it did, or acted
                        // first, is unknown either way.
                        let cancel = CancelledNotificationParam::new(
                            Some(id),
                            Some("idemgate wrap: call timeout".into()),
                        );
                        let _ = peer.notify_cancelled(cancel).await;
                        Err(elapsed)
                    }
                }
            }
            Err(e) => Ok(Err(e)),
        };
        match answer {
            Err(_) => CallAnswer::Ambiguous(format!(
                "the child MCP server `{child}` did not answer `{name}` within {seconds} s"
            )),
            Ok(Ok(ServerResult::CallToolResult(result))) => match serde_json::to_value(&result) {
                Ok(Value::Object(map)) => CallAnswer::Answered(map),
                _ => CallAnswer::Ambiguous(format!(
                    "the answer of `{child}` to `{name}` could not be read"
                )),
            },
            Ok(Ok(_)) => classify_error(&child, name, ServiceError::UnexpectedResponse),
            Ok(Err(e)) => {
                if matches!(
                    e,
                    ServiceError::TransportClosed | ServiceError::TransportSend(_)
                ) {
                    // The SDK may not have noticed yet; the next call must start a new child
                    // rather than send into this dead one.
                    self.forget(generation).await;
                }
                classify_error(&child, name, e)
            }
        }
    }

    /// Drops connection `generation` if it is still the current one.
    async fn forget(&self, generation: u64) {
        let mut state = self.state.lock().await;
        if state.generation == generation {
            state.connection = None;
        }
    }

    /// Passes one request (resources, prompts, completion, subscriptions, the log level) to
    /// the child unchanged. Dropping the future before the answer tells the child the request
    /// was cancelled.
    pub async fn forward(&self, method: &str, params: Value) -> Result<Value, ForwardError> {
        let down = |message: String| ForwardError {
            code: -32603,
            message,
            data: None,
        };
        let (peer, _) = self.peer().await.map_err(down)?;
        let bad = |e: serde_json::Error| ForwardError {
            code: -32602,
            message: format!("invalid params for `{method}`: {e}"),
            data: None,
        };
        let answer = tokio::time::timeout(self.spec.call_timeout, async {
            macro_rules! ask {
                ($call:ident) => {
                    peer.$call(serde_json::from_value(params).map_err(bad)?)
                        .await
                        .map(|r| serde_json::to_value(r).unwrap_or(Value::Null))
                };
            }
            let result = match method {
                "resources/list" => ask!(list_resources),
                "resources/templates/list" => ask!(list_resource_templates),
                "resources/read" => ask!(read_resource),
                "prompts/list" => ask!(list_prompts),
                "prompts/get" => ask!(get_prompt),
                "completion/complete" => ask!(complete),
                "resources/subscribe" => {
                    let request = Request::new(serde_json::from_value(params).map_err(bad)?);
                    peer.send_request(ClientRequest::SubscribeRequest(request))
                        .await
                        .map(|_| json!({}))
                }
                "resources/unsubscribe" => {
                    let request = Request::new(serde_json::from_value(params).map_err(bad)?);
                    peer.send_request(ClientRequest::UnsubscribeRequest(request))
                        .await
                        .map(|_| json!({}))
                }
                "logging/setLevel" => {
                    let request = Request::new(serde_json::from_value(params).map_err(bad)?);
                    peer.send_request(ClientRequest::SetLevelRequest(request))
                        .await
                        .map(|_| json!({}))
                }
                _ => {
                    return Err(ForwardError {
                        code: -32601,
                        message: format!("`{method}` is not passed to the child"),
                        data: None,
                    });
                }
            };
            result.map_err(|e| match e {
                ServiceError::McpError(e) => ForwardError {
                    code: e.code.0,
                    message: e.message.to_string(),
                    data: e.data,
                },
                other => down(format!(
                    "the child MCP server `{}` failed `{method}`: {other}",
                    self.spec.display()
                )),
            })
        })
        .await;
        answer.unwrap_or_else(|_| {
            Err(down(format!(
                "the child MCP server `{}` did not answer `{method}` within {} s",
                self.spec.display(),
                self.spec.call_timeout.as_secs()
            )))
        })
    }

    /// Whether a child process is running and connected now (for tests and status lines).
    pub async fn is_up(&self) -> bool {
        let state = self.state.lock().await;
        state.connection.as_ref().is_some_and(|c| !c.is_closed())
    }

    /// Closes the connection; the child gets its stdin closed and is then killed.
    pub async fn shutdown(&self) {
        let connection = self.state.lock().await.connection.take();
        if let Some(mut connection) = connection {
            let _ = connection.close_with_timeout(Duration::from_secs(3)).await;
        }
    }
}

/// How long to wait before the next start after `failures` failed starts in a row: 0.4 s,
/// 0.8 s, 1.6 s, … doubling, never more than `max`.
fn backoff(failures: u32, max: Duration) -> Duration {
    Duration::from_millis(200)
        .saturating_mul(1u32 << failures.clamp(1, 16))
        .min(max)
}

/// A transport or protocol failure during a call. Which of them can prove that nothing was
/// sent? Only a request that never left: a failed write of the request itself. The SDK does
/// not tell a write failure of this request from one of the stream before it, and a child
/// that closed its stdin may still have read the request, so every failure here is ambiguous
/// — except a JSON-RPC error the child answered, which is a definite answer without a result:
/// it may still have acted first (the child is a black box), so it is ambiguous too.
fn classify_error(child: &str, name: &str, e: ServiceError) -> CallAnswer {
    let reason = match e {
        ServiceError::TransportClosed | ServiceError::TransportSend(_) => {
            format!("the child MCP server `{child}` ended during `{name}`")
        }
        ServiceError::McpError(e) => format!(
            "the child MCP server `{child}` answered `{name}` with a JSON-RPC error {}: {}",
            e.code.0, e.message
        ),
        ServiceError::UnexpectedResponse => {
            format!(
                "the child MCP server `{child}` answered `{name}` with something other than a tool result"
            )
        }
        ServiceError::Timeout { .. } => {
            format!("the child MCP server `{child}` did not answer `{name}` in time")
        }
        other => format!("the call of `{name}` on `{child}` failed: {other}"),
    };
    CallAnswer::Ambiguous(reason)
}

async fn connect(spec: &ChildSpec, relay: &Arc<Relay>) -> Result<Connection, StartError> {
    let child = spec.display();
    let mut command = Command::new(&spec.program);
    command.args(&spec.args);
    let transport = TokioChildProcess::builder(command)
        // The child's diagnostics go where ours do: stderr, never the protocol stream.
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .map(|(transport, _)| transport)
        .map_err(|e| StartError::Spawn {
            child: child.clone(),
            message: e.to_string(),
        })?;
    let seconds = spec.start_timeout.as_secs();
    let handler = Handler {
        relay: relay.clone(),
    };
    match tokio::time::timeout(spec.start_timeout, handler.serve(transport)).await {
        Err(_) => Err(StartError::Timeout {
            child,
            step: "initialize",
            seconds,
        }),
        Ok(Err(e)) => Err(StartError::NotMcp {
            child,
            message: e.to_string(),
        }),
        Ok(Ok(connection)) => Ok(connection),
    }
}

async fn describe(spec: &ChildSpec, connection: &Connection) -> Result<Started, StartError> {
    let child = spec.display();
    let seconds = spec.start_timeout.as_secs();
    let listed = tokio::time::timeout(spec.start_timeout, connection.peer().list_all_tools())
        .await
        .map_err(|_| StartError::Timeout {
            child: child.clone(),
            step: "tools/list",
            seconds,
        })?
        .map_err(|e| StartError::Tools {
            child: child.clone(),
            message: e.to_string(),
        })?;
    let tools = tools_as_json(&listed);
    let info = connection.peer_info();
    let to_json = |v: Option<Value>| v.unwrap_or(Value::Null);
    Ok(Started {
        tools,
        capabilities: to_json(
            info.as_ref()
                .and_then(|i| serde_json::to_value(&i.capabilities).ok()),
        ),
        server_info: to_json(
            info.as_ref()
                .and_then(|i| serde_json::to_value(&i.server_info).ok()),
        ),
        instructions: info.as_ref().and_then(|i| i.instructions.clone()),
    })
}

fn tools_as_json(listed: &[rmcp::model::Tool]) -> Vec<Map<String, Value>> {
    listed
        .iter()
        .filter_map(|t| match serde_json::to_value(t) {
            Ok(Value::Object(map)) => Some(map),
            _ => None,
        })
        .collect()
}

/// The arguments of a call as the SDK's object type.
pub fn arguments_object(value: &Value) -> Option<JsonObject> {
    value.as_object().cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_and_is_bounded() {
        let max = Duration::from_secs(30);
        let waits: Vec<u128> = (1..=10).map(|n| backoff(n, max).as_millis()).collect();
        assert_eq!(
            waits,
            [
                400, 800, 1600, 3200, 6400, 12800, 25600, 30000, 30000, 30000
            ]
        );
        assert_eq!(backoff(u32::MAX, max), max);
    }

    #[tokio::test]
    async fn a_command_that_cannot_start_is_named() {
        let spec = ChildSpec::new("/nonexistent/mcp-server", vec!["--flag".into()]);
        let err = Child::start(spec).await.unwrap_err();
        assert!(
            err.to_string()
                .contains("`/nonexistent/mcp-server --flag` could not be started"),
            "{err}"
        );
    }
}
