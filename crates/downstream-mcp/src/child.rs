//! The child MCP server: started over stdio, initialised, asked for its tools, called, and
//! started again after it dies.
//!
//! **The one module of this crate that knows the MCP SDK** (`rmcp`, client side, with its
//! child-process transport). Everything it hands out is plain JSON, so the MCP face and the
//! downstream never see the SDK's client types.

// Sampling, roots and logging are deprecated by the 2026-07-28 revision (SEP-2577); wrap
// speaks the handshake revision to its child, where they are current, and passes them on.
#![allow(deprecated)]

use std::collections::BTreeMap;
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
    /// The connection (the child process) this handler serves: progress tokens are the SDK's,
    /// counted afresh on every connection.
    connection: u64,
}

fn to_error(e: ForwardError) -> ErrorData {
    ErrorData::new(rmcp::model::ErrorCode(e.code), e.message, e.data)
}

impl Handler {
    /// One request of the child for the host, read back as the SDK's answer type. When the
    /// child cancels its request (`notifications/cancelled`), the host's request is dropped,
    /// which tells the host it was cancelled: nobody waits for its model or its user any more.
    async fn ask<P: serde::Serialize, T: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        params: P,
        context: &RequestContext<RoleClient>,
    ) -> Result<T, ErrorData> {
        let params = serde_json::to_value(params).unwrap_or(Value::Null);
        let answer = tokio::select! {
            answer = self.relay.ask(method, params) => answer.map_err(to_error)?,
            () = context.ct.cancelled() => {
                return Err(ErrorData::internal_error(
                    format!("`{method}` was cancelled by the child"),
                    None,
                ));
            }
        };
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
        context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        self.ask("sampling/createMessage", params, &context).await
    }

    async fn list_roots(
        &self,
        context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        self.ask("roots/list", json!({}), &context).await
    }

    async fn create_elicitation(
        &self,
        params: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        self.ask("elicitation/create", params, &context).await
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let params = serde_json::to_value(params).unwrap_or(Value::Null);
        self.relay.progress(self.connection, params).await;
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

/// What the host set on the child besides its calls, so that a child started again is set the
/// same way before it serves anything: the last log level the child accepted, and every
/// resource subscribed and not unsubscribed since — each as the host's params, without
/// `_meta` (the SDK sets its own).
#[derive(Debug, Default)]
struct Session {
    level: Option<Value>,
    /// By URI.
    subscribed: BTreeMap<String, Value>,
}

impl Session {
    /// The requests that set a new process as the host set the last one: the level first, so
    /// that whatever a subscription logs is logged at it.
    fn replay(&self) -> Vec<(&'static str, Value)> {
        let level = self.level.iter().map(|l| ("logging/setLevel", l.clone()));
        let subscribed = self
            .subscribed
            .values()
            .map(|p| ("resources/subscribe", p.clone()));
        level.chain(subscribed).collect()
    }

    /// Keeps what a request the child accepted set on it. An unsubscription is kept whatever
    /// the child answered: the host wants no updates of that resource from the next process.
    fn remember(&mut self, method: &str, params: &Value, accepted: bool) {
        let (params, uri) = kept(params);
        match (method, uri) {
            ("logging/setLevel", _) if accepted => self.level = Some(params),
            ("resources/subscribe", Some(uri)) if accepted => {
                self.subscribed.insert(uri, params);
            }
            ("resources/unsubscribe", Some(uri)) => {
                self.subscribed.remove(&uri);
            }
            _ => {}
        }
    }
}

/// `params` without `_meta`, and the URI a subscription names.
fn kept(params: &Value) -> (Value, Option<String>) {
    let mut params = params.clone();
    if let Some(object) = params.as_object_mut() {
        object.remove("_meta");
    }
    let uri = params.get("uri").and_then(Value::as_str).map(String::from);
    (params, uri)
}

/// One child MCP server, shared by every tool it offers. A call that finds it dead starts it
/// again, no sooner than the backoff allows (0.4 s doubling up to `max_backoff`).
pub struct Child {
    spec: ChildSpec,
    state: Mutex<State>,
    relay: Arc<Relay>,
    /// A std mutex: held only to read or change the maps, never across an await.
    session: std::sync::Mutex<Session>,
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
        let connection = connect(&spec, &relay, 0).await?;
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
            session: std::sync::Mutex::new(Session::default()),
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
        match connect(&self.spec, &self.relay, state.generation + 1).await {
            Ok(connection) => {
                let peer = connection.peer().clone();
                // Still under the lock: nothing reaches the new process before it is set as the
                // host set the one that ended.
                self.restore(&peer).await;
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

    /// The log level and subscriptions the host set, sent to a process just started. A request
    /// the new process refuses or does not answer is logged and skipped: the host learns of
    /// it no differently than of a child that stopped sending updates.
    async fn restore(&self, peer: &Peer<RoleClient>) {
        let replay = self.session().replay();
        for (method, params) in replay {
            let asked = tokio::time::timeout(self.spec.call_timeout, request(peer, method, params));
            let failure = match asked.await {
                Ok(Ok(_)) => continue,
                Ok(Err(failed)) => failed.to_string(),
                Err(_) => format!("no answer within {} s", self.spec.call_timeout.as_secs()),
            };
            tracing::warn!(child = %self.spec.display(), method, error = %failure, "the child started again refused what the host had set on the one that ended");
        }
    }

    fn session(&self) -> std::sync::MutexGuard<'_, Session> {
        self.session.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One `tools/call` for the operation `operation`. `meta` goes to the child as the
    /// request's `_meta`.
    pub async fn call_tool(
        &self,
        name: &str,
        operation: &str,
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
        let sending = self.relay.sending().await;
        let sent = peer
            .send_request_with_option(request, PeerRequestOptions::no_options())
            .await;
        let answer = match sent {
            Ok(handle) => {
                // The SDK gives every request its own progress token: progress under it is
                // passed to the host's request that announced this operation, if one waits.
                let token = serde_json::to_value(&handle.progress_token).unwrap_or(Value::Null);
                sending.claim(operation, name, &arguments_value, generation, token);
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
            Err(e) => {
                drop(sending);
                Ok(Err(e))
            }
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
    /// the child unchanged, and keeps what a subscription or the log level set, for a child
    /// started again. Dropping the future before the answer tells the child the request was
    /// cancelled.
    pub async fn forward(&self, method: &str, params: Value) -> Result<Value, ForwardError> {
        let down = |message: String| ForwardError {
            code: -32603,
            message,
            data: None,
        };
        let (peer, _) = self.peer().await.map_err(down)?;
        let asked = params.clone();
        let answer = tokio::time::timeout(self.spec.call_timeout, request(&peer, method, params))
            .await
            .unwrap_or_else(|_| {
                Err(Failed::Service(ServiceError::Timeout {
                    timeout: self.spec.call_timeout,
                }))
            });
        self.session().remember(method, &asked, answer.is_ok());
        answer.map_err(|failed| match failed {
            Failed::Params(e) => ForwardError {
                code: -32602,
                message: format!("invalid params for `{method}`: {e}"),
                data: None,
            },
            Failed::NotPassed => ForwardError {
                code: -32601,
                message: format!("`{method}` is not passed to the child"),
                data: None,
            },
            Failed::Service(ServiceError::McpError(e)) => ForwardError {
                code: e.code.0,
                message: e.message.to_string(),
                data: e.data,
            },
            Failed::Service(ServiceError::Timeout { .. }) => down(format!(
                "the child MCP server `{}` did not answer `{method}` within {} s",
                self.spec.display(),
                self.spec.call_timeout.as_secs()
            )),
            Failed::Service(other) => down(format!(
                "the child MCP server `{}` failed `{method}`: {other}",
                self.spec.display()
            )),
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

/// Why a request passed to the child has no answer.
#[derive(Debug, thiserror::Error)]
enum Failed {
    #[error("invalid params: {0}")]
    Params(serde_json::Error),
    #[error("not a request passed to the child")]
    NotPassed,
    #[error("{0}")]
    Service(ServiceError),
}

/// One request passed to the child as the SDK's request type, its answer as JSON.
async fn request(peer: &Peer<RoleClient>, method: &str, params: Value) -> Result<Value, Failed> {
    // A typed call of the SDK, with its answer as JSON.
    macro_rules! ask {
        ($call:ident) => {
            peer.$call(serde_json::from_value(params).map_err(Failed::Params)?)
                .await
                .map(|r| serde_json::to_value(r).unwrap_or(Value::Null))
        };
    }
    // A request whose answer is empty.
    macro_rules! empty {
        ($variant:ident) => {
            peer.send_request(ClientRequest::$variant(Request::new(
                serde_json::from_value(params).map_err(Failed::Params)?,
            )))
            .await
            .map(|_| json!({}))
        };
    }
    let result = match method {
        "resources/list" => ask!(list_resources),
        "resources/templates/list" => ask!(list_resource_templates),
        "resources/read" => ask!(read_resource),
        "prompts/list" => ask!(list_prompts),
        "prompts/get" => ask!(get_prompt),
        "completion/complete" => ask!(complete),
        "resources/subscribe" => empty!(SubscribeRequest),
        "resources/unsubscribe" => empty!(UnsubscribeRequest),
        "logging/setLevel" => empty!(SetLevelRequest),
        _ => return Err(Failed::NotPassed),
    };
    result.map_err(Failed::Service)
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

/// Starts the child process as connection number `connection`.
async fn connect(
    spec: &ChildSpec,
    relay: &Arc<Relay>,
    connection: u64,
) -> Result<Connection, StartError> {
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
        connection,
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

    #[test]
    fn a_child_started_again_gets_the_last_level_and_the_live_subscriptions() {
        let mut session = Session::default();
        let asked = [
            ("logging/setLevel", json!({"level": "info"}), true),
            (
                "resources/subscribe",
                json!({"uri": "a://1", "_meta": {"progressToken": 3}}),
                true,
            ),
            ("resources/subscribe", json!({"uri": "a://2"}), true),
            ("resources/subscribe", json!({"uri": "a://refused"}), false),
            ("logging/setLevel", json!({"level": "debug"}), true),
            ("logging/setLevel", json!({"level": "nonsense"}), false),
            ("resources/unsubscribe", json!({"uri": "a://2"}), false),
            ("resources/read", json!({"uri": "a://3"}), true),
        ];
        for (method, params, accepted) in asked {
            session.remember(method, &params, accepted);
        }
        assert_eq!(
            session.replay(),
            [
                ("logging/setLevel", json!({"level": "debug"})),
                ("resources/subscribe", json!({"uri": "a://1"})),
            ]
        );
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
