//! **The one module that knows the MCP SDK** (`rmcp`). It turns the pure [`crate::tools`]
//! mapping into the SDK's types and wires the two transports: stdio ([`serve_stdio`],
//! [`serve_io`]) and streamable HTTP ([`streamable_http_service`]). The SDK moves fast; when
//! it changes, this file is the one to change.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{self, HeaderValue, Request, Response, StatusCode, header};
use idemgate_core::contract::{Contract, EffectClass, Identity};
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::{ErrorCode, Outcome, Repeatable};
use idemgate_core::store::BoxFuture;
use idemgate_engine::Caller;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock,
    CreateTaskResult, DetailedTask, GetTaskParams, GetTaskResult, Implementation, JsonObject,
    ListToolsResult, MetaObject, PaginatedRequestParams, ServerCapabilities, ServerConfig, Task,
    TaskPayload, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Map, Value};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::fake::{self, FakeDownstreams};
use crate::gateway::Gateway;
use crate::identity::{self as derive, Principal, REPEAT_OF, Rule};
use crate::tools::{self, Catalog, Reply, STATUS_TOOL, ToolSpec};
use crate::wrapped::{self, Wrap};

/// What instructs a model once per connection, beside the tool descriptions.
const INSTRUCTIONS: &str = "Tools here are executed by idemgate: each operation runs at most \
once, and the application running you names each operation — you never supply a key. Every \
result has `status` and `next_action`. `applied` or `replayed`: done, do not call again for \
this step. `in_flight`: poll idemgate_operation_status with the operation_key instead of \
calling again. `unknown`: do not call again; an operator reconciles it. `rejected`: nothing \
happened; read error.code.";

/// Why a server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Catalog(#[from] tools::Error),
    #[error("the MCP session could not start: {0}")]
    Start(String),
    #[error("the MCP session ended abnormally: {0}")]
    Run(String),
    #[error("the wrapped child's tools cannot be served: {0}")]
    Wrapped(String),
}

/// Settings shared by both transports.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Serve the hidden fake-downstream control tool over these fakes (demos and tests only).
    pub fakes: Option<FakeDownstreams>,
    /// The server's identity rule for calls without `_meta` (a contract's own `identity`
    /// wins): `meta` rejects a key-based call without it, `session_window` derives its key.
    pub identity: Identity,
    /// `idemgate wrap`: serve a child MCP server's tools as it lists them, and pass its other
    /// requests through (see [`crate::wrapped`]).
    pub wrap: Option<Wrap>,
}

/// How a call learns its caller.
#[derive(Clone, Debug)]
enum Who {
    /// stdio: one local agent, configured at start.
    Fixed(Caller),
    /// streamable HTTP: each request's own authentication, stored in its extensions by
    /// [`McpHttpService`].
    PerRequest,
}

/// The `Mcp-Session-Id` header of a streamable-HTTP request: the MCP session, when the server
/// keeps sessions (validated by the SDK's session manager before the handler runs).
const SESSION_HEADER: &str = "mcp-session-id";

/// The caller authenticated for one HTTP request, in the request's extensions. A wrapper type
/// so that no other extension can be mistaken for it.
#[derive(Clone, Debug)]
struct Authenticated(Caller);

/// The tools served now: fixed for contracts, rebuilt for `wrap` whenever the child's list
/// changes (see [`wrapped::Listing`]).
struct Served {
    catalog: Catalog,
    /// The served contracts by name, for the session-window rule's fingerprint.
    contracts: BTreeMap<String, Arc<Contract>>,
    listed: Vec<Tool>,
    /// The wrap listing's generation this was built from.
    generation: u64,
}

struct Shared {
    gateway: Arc<dyn Gateway>,
    served: std::sync::RwLock<Arc<Served>>,
    identity: Identity,
    /// Whether the HTTP service keeps sessions: only then is `Mcp-Session-Id` a session the
    /// SDK validated, rather than a header any stateless request may carry.
    http_sessions: bool,
    fakes: Option<FakeDownstreams>,
    wrap: Option<Wrap>,
    /// `wrap` over stdio: the host's connection, attached to the child at its first request.
    host: std::sync::OnceLock<()>,
}

impl Shared {
    fn new(gateway: Arc<dyn Gateway>, options: Options) -> Result<Shared, Error> {
        let served = match &options.wrap {
            Some(wrap) => Shared::wrapping(gateway.as_ref(), wrap, options.identity)?,
            None => {
                let served = gateway.tools();
                let catalog = Catalog::with_identity(&served, options.identity)?;
                let listed = catalog.tools().map(to_tool).collect();
                let contracts = served.into_iter().map(|c| (c.name.clone(), c)).collect();
                Served {
                    catalog,
                    contracts,
                    listed,
                    generation: 0,
                }
            }
        };
        Ok(Shared {
            gateway,
            served: std::sync::RwLock::new(Arc::new(served)),
            identity: options.identity,
            http_sessions: false,
            fakes: if options.wrap.is_some() {
                None
            } else {
                options.fakes
            },
            wrap: options.wrap,
            host: std::sync::OnceLock::new(),
        })
    }

    /// The tools served now. Under `wrap`, a listing newer than the one served is taken up
    /// first; one that cannot be served leaves the previous one in place, with a log line.
    fn served(&self) -> Arc<Served> {
        let current = self
            .served
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let Some(wrap) = &self.wrap else {
            return current;
        };
        if wrap.listing.generation() == current.generation {
            return current;
        }
        match Shared::wrapping(self.gateway.as_ref(), wrap, self.identity) {
            Ok(next) => {
                let next = Arc::new(next);
                *self.served.write().unwrap_or_else(|e| e.into_inner()) = next.clone();
                next
            }
            Err(e) => {
                tracing::error!(error = %e, "the child's changed tool list cannot be served; keeping the previous one");
                current
            }
        }
    }

    /// The child's tools, listed as the child lists them, each routed to the contract of
    /// the same name; idemgate's status tool first. A tool whose calls are named by the
    /// session-window rule lists the optional `repeat_of` too, and says what a repeat means.
    fn wrapping(gateway: &dyn Gateway, wrap: &Wrap, identity: Identity) -> Result<Served, Error> {
        // The generation first: a listing replaced meanwhile is taken up on the next read.
        let generation = wrap.listing.generation();
        let tools = wrap.listing.tools();
        let served = gateway.tools();
        let contracts: BTreeMap<String, Arc<Contract>> =
            served.into_iter().map(|c| (c.name.clone(), c)).collect();
        let names: Vec<String> = tools
            .iter()
            .filter_map(|t| t.get("name").and_then(Value::as_str).map(String::from))
            .collect();
        let catalog = Catalog::wrapped(&names, &contracts, identity)?;
        let mut listed = vec![to_tool(&ToolSpec::status())];
        for tool in &tools {
            let mut parsed: Tool = serde_json::from_value(Value::Object(tool.clone()))
                .map_err(|e| Error::Wrapped(format!("a listed tool could not be read: {e}")))?;
            let spec = catalog.get(&parsed.name);
            let contract = spec
                .and_then(|s| s.contract.as_ref())
                .and_then(|c| contracts.get(c));
            if let (Some(spec), Some(contract)) = (spec, contract)
                && let Identity::SessionWindow(window) = spec.identity
            {
                let mut schema = (*parsed.input_schema).clone();
                tools::add_repeat_of(&mut schema);
                parsed.input_schema = Arc::new(schema);
                let theirs = parsed
                    .description
                    .as_deref()
                    .unwrap_or("")
                    .trim()
                    .to_string();
                let ours = idemgate_core::describe::windowed_semantics(contract, window);
                parsed.description = Some(if theirs.is_empty() {
                    format!("Retries: {ours}").into()
                } else {
                    format!("{theirs}\n\nRetries: {ours}").into()
                });
            }
            listed.push(parsed);
        }
        Ok(Served {
            catalog,
            contracts,
            listed,
            generation,
        })
    }
}

fn to_tool(spec: &ToolSpec) -> Tool {
    let hints = spec.hints;
    let annotations = ToolAnnotations::with_title(spec.title.clone())
        .read_only(hints.read_only)
        .destructive(hints.destructive)
        .idempotent(hints.idempotent)
        .open_world(hints.open_world);
    let mut tool = Tool::new(
        spec.name.clone(),
        spec.description.clone(),
        Arc::new(spec.input_schema.clone()),
    )
    .with_title(spec.title.clone())
    .with_annotations(annotations);
    if let Some(schema) = &spec.output_schema {
        tool = tool.with_raw_output_schema(Arc::new(schema.clone()));
    }
    if let Some(meta) = &spec.meta {
        tool = tool.with_meta(MetaObject(meta.clone()));
    }
    tool
}

fn control_tool() -> Tool {
    Tool::new(
        fake::CONTROL_TOOL,
        "Test control of the in-process fake downstreams (served only with --fake-downstream): \
read a fake's own effect count, script its next answer, finish an accepted job.",
        Arc::new(fake::control_schema()),
    )
}

/// The MCP server handler: one per stdio connection or HTTP session, all sharing one catalog.
#[derive(Clone)]
struct Handler {
    shared: Arc<Shared>,
    who: Who,
    /// A session id fixed for the connection, for a transport whose connections are sessions.
    /// None over stdio, where the key comes from the configured principal alone, so a server
    /// restarted by its host is the same session; over HTTP the request's header names it.
    session: Option<Arc<str>>,
}

/// How one call names its operation, decided before the executor sees it.
enum Named {
    /// The parts to hand the executor — from `_meta`, derived, or none (the executor then
    /// rejects a key-based call) — and the rule an answer names: set whenever the tool is
    /// served under `session_window`; under `meta` the description already says it.
    Invoke {
        workflow_id: Option<String>,
        step_id: Option<String>,
        rule: Option<Rule>,
    },
    /// Refused before anything was written.
    Refused(Outcome),
}

fn to_wrapped_result(reply: wrapped::WrappedReply) -> CallToolResult {
    let mut result = if reply.is_error {
        CallToolResult::structured_error(reply.structured)
    } else {
        CallToolResult::structured(reply.structured)
    };
    // The child's blocks as it answered them; a block this SDK cannot read becomes text
    // rather than vanishing.
    result.content = reply
        .content
        .into_iter()
        .map(|block| {
            serde_json::from_value(block.clone())
                .unwrap_or_else(|_| ContentBlock::text(block.to_string()))
        })
        .collect();
    result
}

/// One member of the child's capabilities, when this SDK can read it.
fn capability<T: serde::de::DeserializeOwned>(child: &Value, name: &str) -> Option<T> {
    child
        .get(name)
        .and_then(|v| serde_json::from_value(v.clone()).ok())
}

fn forwarded(e: wrapped::Forwarded) -> ErrorData {
    ErrorData::new(rmcp::model::ErrorCode(e.code), e.message, e.data)
}

fn not_found(method: &'static str) -> ErrorData {
    ErrorData::new(rmcp::model::ErrorCode::METHOD_NOT_FOUND, method, None)
}

/// The host of `wrap`, as the child's notifications and requests reach it. Notifications go
/// out in the order they came, from one task, never waited for by the child.
struct HostPeer {
    peer: rmcp::Peer<RoleServer>,
    notifications: tokio::sync::mpsc::UnboundedSender<(String, Value)>,
}

impl HostPeer {
    fn new(peer: rmcp::Peer<RoleServer>) -> HostPeer {
        let (notifications, mut queue) = tokio::sync::mpsc::unbounded_channel::<(String, Value)>();
        let sender = peer.clone();
        tokio::spawn(async move {
            while let Some((method, params)) = queue.recv().await {
                if let Err(e) = notify_host(&sender, &method, params).await {
                    tracing::debug!(method, error = %e, "a notification of the child did not reach the host");
                }
            }
        });
        HostPeer {
            peer,
            notifications,
        }
    }

    /// Whether the host declared `capability` (`sampling`, `elicitation`, `roots`) at
    /// `initialize`; `None` when it did not initialise (the 2026-07-28 revision has no
    /// `initialize`, and takes no server-to-client request).
    fn declared(&self, capability: &str) -> Option<bool> {
        let info = self.peer.peer_info()?;
        Some(
            serde_json::to_value(&info.capabilities)
                .ok()
                .and_then(|caps| caps.get(capability).cloned())
                .is_some_and(|c| !c.is_null()),
        )
    }
}

/// One notification of the child, as the SDK's type, to the host.
#[allow(deprecated)] // logging is deprecated by the 2026-07-28 revision, and still passed on
async fn notify_host(
    peer: &rmcp::Peer<RoleServer>,
    method: &str,
    params: Value,
) -> Result<(), String> {
    fn read<T: serde::de::DeserializeOwned>(params: Value) -> Result<T, String> {
        serde_json::from_value(params).map_err(|e| e.to_string())
    }
    let sent = match method {
        "notifications/message" => peer.notify_logging_message(read(params)?).await,
        "notifications/progress" => peer.notify_progress(read(params)?).await,
        "notifications/resources/updated" => peer.notify_resource_updated(read(params)?).await,
        "notifications/resources/list_changed" => peer.notify_resource_list_changed().await,
        "notifications/prompts/list_changed" => peer.notify_prompt_list_changed().await,
        "notifications/tools/list_changed" => peer.notify_tool_list_changed().await,
        other => return Err(format!("`{other}` is not passed to the host")),
    };
    sent.map_err(|e| e.to_string())
}

/// A request to the host that nobody waits for any more unless [`Abandoned::answered`] is
/// called: dropping it sends the host `notifications/cancelled` for the request.
struct Abandoned {
    peer: Option<rmcp::Peer<RoleServer>>,
    id: rmcp::model::RequestId,
}

impl Abandoned {
    fn answered(mut self) {
        self.peer = None;
    }
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        let (Some(peer), Ok(runtime)) = (self.peer.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        let cancel = rmcp::model::CancelledNotificationParam::new(
            Some(self.id.clone()),
            Some("the child MCP server cancelled its request".into()),
        );
        runtime.spawn(async move {
            if let Err(e) = peer.notify_cancelled(cancel).await {
                tracing::debug!(error = %e, "the host was not told of a cancelled request");
            }
        });
    }
}

impl wrapped::Host for HostPeer {
    fn notify(&self, method: &str, params: Value) {
        let _ = self.notifications.send((method.to_string(), params));
    }

    fn request<'a>(
        &'a self,
        method: &'a str,
        params: Value,
    ) -> BoxFuture<'a, Result<Value, wrapped::Forwarded>> {
        Box::pin(async move {
            let refuse = |code: i32, message: String| wrapped::Forwarded {
                code,
                message,
                data: None,
            };
            let needs = match method {
                "sampling/createMessage" => "sampling",
                "elicitation/create" => "elicitation",
                "roots/list" => "roots",
                other => {
                    return Err(refuse(
                        -32601,
                        format!("`{other}` is not passed to the host"),
                    ));
                }
            };
            match self.declared(needs) {
                Some(true) => {}
                Some(false) => {
                    return Err(refuse(
                        -32601,
                        format!(
                            "the host of idemgate wrap did not declare the `{needs}` capability, so `{method}` cannot be passed to it"
                        ),
                    ));
                }
                None => {
                    return Err(refuse(
                        -32601,
                        format!(
                            "the host of idemgate wrap did not initialise (protocol 2026-07-28 takes no request from a server), so `{method}` cannot be passed to it"
                        ),
                    ));
                }
            }
            let bad = |e: serde_json::Error| refuse(-32602, format!("invalid `{method}`: {e}"));
            let request = match needs {
                "sampling" => rmcp::model::ServerRequest::CreateMessageRequest(
                    rmcp::model::Request::new(serde_json::from_value(params).map_err(bad)?),
                ),
                "elicitation" => rmcp::model::ServerRequest::ElicitRequest(
                    rmcp::model::Request::new(serde_json::from_value(params).map_err(bad)?),
                ),
                _ => rmcp::model::ServerRequest::ListRootsRequest(Default::default()),
            };
            let sent = self
                .peer
                .send_request_with_option(request, rmcp::service::PeerRequestOptions::no_options())
                .await;
            let answer = match sent {
                Ok(handle) => {
                    // Dropped before the answer (the child cancelled its request): the host
                    // is told, so that its model or its user stops working on it.
                    let abandoned = Abandoned {
                        peer: Some(self.peer.clone()),
                        id: handle.id.clone(),
                    };
                    let answer = handle.await_response().await;
                    abandoned.answered();
                    answer
                }
                Err(e) => Err(e),
            };
            match answer {
                Ok(answer) => Ok(serde_json::to_value(answer).unwrap_or(Value::Null)),
                Err(rmcp::ServiceError::McpError(e)) => Err(wrapped::Forwarded {
                    code: e.code.0,
                    message: e.message.to_string(),
                    data: e.data,
                }),
                Err(e) => Err(refuse(
                    -32603,
                    format!("the host of idemgate wrap could not be asked `{method}`: {e}"),
                )),
            }
        })
    }
}

impl Handler {
    /// Under `wrap`, the first request (or `notifications/initialized`) attaches the host's
    /// connection to the child, for the child's notifications and requests.
    fn attach_host(&self, context: &RequestContext<RoleServer>) {
        self.attach_peer(&context.peer);
    }

    fn attach_peer(&self, peer: &rmcp::Peer<RoleServer>) {
        if let Some(wrap) = &self.shared.wrap
            && self.shared.host.set(()).is_ok()
        {
            wrap.child.attach(Arc::new(HostPeer::new(peer.clone())));
        }
    }

    /// Passes one request to the wrapped child and reads its answer as `T`.
    async fn forward<T: serde::de::DeserializeOwned>(
        &self,
        method: &'static str,
        params: impl serde::Serialize,
        context: &RequestContext<RoleServer>,
    ) -> Result<T, ErrorData> {
        let Some(wrap) = &self.shared.wrap else {
            return Err(not_found(method));
        };
        self.attach_host(context);
        let params = serde_json::to_value(params).unwrap_or(Value::Null);
        // A cancelled request drops the forward, which tells the child it was cancelled.
        let mut answer = tokio::select! {
            answer = wrap.child.forward(method, params) => answer.map_err(forwarded)?,
            () = context.ct.cancelled() => {
                return Err(ErrorData::internal_error("the request was cancelled", None));
            }
        };
        // A child on an older protocol revision answers without `resultType`, which the
        // 2026-07-28 revision requires of a complete result; absent means complete.
        if let Value::Object(fields) = &mut answer {
            fields
                .entry("resultType")
                .or_insert_with(|| Value::String("complete".into()));
        }
        serde_json::from_value(answer).map_err(|e| {
            ErrorData::internal_error(format!("the child's answer to `{method}`: {e}"), None)
        })
    }
}

impl Named {
    fn derived(key: OperationKey, rule: Rule) -> Named {
        Named::Invoke {
            workflow_id: Some(key.workflow_id().to_string()),
            step_id: Some(key.step_id().to_string()),
            rule: Some(rule),
        }
    }
}

fn to_result(reply: Reply) -> CallToolResult {
    let mut result = if reply.is_error {
        CallToolResult::structured_error(reply.structured)
    } else {
        CallToolResult::structured(reply.structured)
    };
    // The structured content is the outcome; the text is the one sentence a model reads.
    result.content = vec![ContentBlock::text(reply.text)];
    result
}

/// An operation still in flight (running, owned by another worker, a job, awaiting approval) as
/// a task of the tasks extension: its id is the operation key, its state the durable record.
/// `None` for an answer that is final, or that has no operation key.
fn as_task(outcome: &Outcome, now: idemgate_core::record::Millis) -> Option<Task> {
    if outcome.status != idemgate_core::outcome::Status::InFlight || outcome.safe_to_repeat() {
        return None;
    }
    let key = outcome.operation_key.as_ref()?;
    let poll = outcome.retry_after_seconds.unwrap_or(1).max(1) * 1000;
    let message = Reply::from_outcome(STATUS_TOOL, outcome).text;
    Some(
        Task::new(
            key.as_str(),
            rmcp::model::TaskStatus::Working,
            iso(now),
            iso(now),
        )
        .with_status_message(message)
        .with_poll_interval_ms(poll),
    )
}

/// The operation behind a task, as one caller may see it.
struct TaskOperation {
    key: OperationKey,
    outcome: Outcome,
    /// The MCP tool name of the record's tool.
    tool: String,
    created_at: idemgate_core::record::Millis,
    updated_at: idemgate_core::record::Millis,
}

/// Milliseconds since the epoch as ISO 8601 (`2026-12-01T10:00:00.000Z`).
fn iso(ms: idemgate_core::record::Millis) -> String {
    match chrono::DateTime::from_timestamp_millis(ms) {
        Some(t) => t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
        None => "1970-01-01T00:00:00.000Z".to_string(),
    }
}

impl Handler {
    fn caller(&self, context: &RequestContext<RoleServer>) -> Option<Caller> {
        match &self.who {
            Who::Fixed(caller) => Some(caller.clone()),
            Who::PerRequest => context
                .extensions
                .get::<http::request::Parts>()
                .and_then(|parts| parts.extensions.get::<Authenticated>())
                .map(|a| a.0.clone()),
        }
    }

    /// The MCP session of a call: the stdio connection's, or the HTTP request's
    /// `Mcp-Session-Id` (none in stateless streamable HTTP).
    fn session(&self, context: &RequestContext<RoleServer>) -> Option<String> {
        if let Some(session) = &self.session {
            return Some(session.to_string());
        }
        if !self.shared.http_sessions {
            return None;
        }
        context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.headers.get(SESSION_HEADER))
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }

    /// Names the operation of a call to `contract` served under `identity`: `_meta` when it is
    /// there, else (under `session_window`) a key derived from the caller, the session, the
    /// tool and the fingerprint — or from `repeat_of`. Takes `repeat_of` out of `arguments`
    /// in `session_window`, so it is never validated or fingerprinted as material.
    async fn name(
        &self,
        contract: &Contract,
        identity: Identity,
        caller: &Caller,
        session: Option<&str>,
        meta: &Map<String, Value>,
        arguments: &mut Map<String, Value>,
    ) -> Named {
        let repeat_of = match identity {
            Identity::SessionWindow(_) => arguments.remove(REPEAT_OF),
            Identity::Meta => None,
        };
        let (workflow_id, step_id) = match tools::operation_from_meta(Some(meta)) {
            Err(e) => return Named::Refused(e.outcome()),
            Ok(parts) => parts,
        };
        let Identity::SessionWindow(window) = identity else {
            return Named::Invoke {
                workflow_id,
                step_id,
                rule: None,
            };
        };
        // `_meta` always wins: the agent runtime named the operation.
        if workflow_id.is_some() || step_id.is_some() {
            return Named::Invoke {
                workflow_id,
                step_id,
                rule: Some(Rule::Meta),
            };
        }
        // The fingerprint is taken as the executor takes it, so invalid arguments are refused
        // here with the executor's words and nothing is written.
        let arguments_value = Value::Object(arguments.clone());
        let fingerprint = match contract
            .validate(&arguments_value)
            .and_then(|()| contract.fingerprint(&arguments_value))
        {
            Ok(fp) => fp,
            Err(e) => {
                // No key could be derived: the call named none, and nothing ran.
                return Named::Refused(Outcome::refused(
                    Repeatable::unnamed(),
                    ErrorCode::InvalidArguments,
                    e.message,
                ));
            }
        };
        let gateway = &self.shared.gateway;
        let environment = gateway.environment().to_string();
        let principal = Principal {
            tenant: &caller.tenant,
            actor: &caller.actor,
            session,
        };
        let invalid_key = |e: idemgate_core::key::Error| {
            Outcome::refused(
                Repeatable::unnamed(),
                ErrorCode::InvalidOperationKey,
                e.to_string(),
            )
        };
        let store_down = |e: idemgate_core::store::Error| {
            tracing::warn!(tool = contract.name, error = %e, "session-window lookup failed");
            // Which operation this call is could not be decided: it was not run, but nothing
            // proves the operation it would have been had no effect.
            Outcome::rejected(
                None,
                ErrorCode::StoreUnavailable,
                "the operation store could not be read; this call was not run",
            )
        };
        if let Some(value) = repeat_of {
            let of = match derive::parse_repeat(&value) {
                Ok(of) => of,
                Err(refused) => {
                    return Named::Refused(refused.outcome(&tools::tool_name(&contract.name)));
                }
            };
            // The key must name an operation of this caller, in this environment, made with
            // this tool; one refusal for every other case.
            let record = match gateway.record(&caller.tenant, &of).await {
                Ok(record) => record,
                Err(e) => return Named::Refused(store_down(e)),
            };
            if let Err(refused) =
                derive::check_repeat(record.as_ref(), &principal, &environment, &contract.name)
            {
                return Named::Refused(refused.outcome(&tools::tool_name(&contract.name)));
            }
            return match derive::repeat(&environment, &principal, &contract.name, &fingerprint, &of)
            {
                Ok(key) => Named::derived(key, Rule::RepeatOf { of, window }),
                Err(e) => Named::Refused(invalid_key(e)),
            };
        }
        let now = gateway.now();
        let keys = match derive::windowed(
            &environment,
            &principal,
            &contract.name,
            &fingerprint,
            window,
            now,
        ) {
            Ok(keys) => keys,
            Err(e) => return Named::Refused(invalid_key(e)),
        };
        // An operation first called in the previous interval, less than a window ago, is this
        // call's; otherwise the current interval's key, claimed (or found) by the executor.
        let key = match gateway.record(&caller.tenant, &keys.previous).await {
            Ok(Some(previous)) if derive::within_window(&previous, window, now) => keys.previous,
            Ok(_) => keys.current,
            Err(e) => return Named::Refused(store_down(e)),
        };
        Named::derived(key, Rule::SessionWindow { window })
    }

    /// The operation behind a task id (its operation key), read for this caller as the status
    /// tool reads it: another tenant's task is not found, exactly as a missing one.
    async fn task_operation(
        &self,
        task_id: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<TaskOperation, ErrorData> {
        let not_found = || ErrorData::invalid_params("no such task for this caller", None);
        let caller = self.caller(context).ok_or_else(not_found)?;
        let key = OperationKey::parse(task_id).map_err(|_| not_found())?;
        let outcome = self
            .shared
            .gateway
            .status(&caller, &key)
            .await
            .ok_or_else(not_found)?;
        // The record names its tool and times (read after the status read, which rechecked
        // the caller).
        let now = self.shared.gateway.now();
        let (tool, created_at, updated_at) =
            match self.shared.gateway.record(&caller.tenant, &key).await {
                Ok(Some(record)) => (
                    tools::tool_name(&record.tool),
                    record.created_at,
                    record.updated_at,
                ),
                _ => (STATUS_TOOL.to_string(), now, now),
            };
        Ok(TaskOperation {
            key,
            outcome,
            tool,
            created_at,
            updated_at,
        })
    }

    async fn status(&self, caller: &Caller, arguments: &Map<String, Value>) -> Reply {
        let text = arguments.get("operation_key").and_then(Value::as_str);
        let outcome = match text.map(OperationKey::parse) {
            // A poll is a read: polling again is harmless.
            None => Outcome::refused(
                Repeatable::unnamed(),
                ErrorCode::InvalidArguments,
                "operation_key (a string) is required",
            ),
            Some(Err(e)) => Outcome::refused(
                Repeatable::unnamed(),
                ErrorCode::InvalidOperationKey,
                e.to_string(),
            ),
            Some(Ok(key)) => match self.shared.gateway.status(caller, &key).await {
                Some(outcome) => outcome,
                // The same answer for another tenant's key as for a missing one.
                None => Outcome::rejected(None, ErrorCode::NotFound, "no such operation"),
            },
        };
        Reply::from_outcome(STATUS_TOOL, &outcome)
    }
}

impl ServerHandler for Handler {
    fn get_info(&self) -> ServerConfig {
        // The tasks extension: an operation still in flight is answered as a task backed by
        // its durable record, to clients that declare the extension (see `as_task`).
        let mut capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tasks()
            .build();
        let mut instructions = INSTRUCTIONS.to_string();
        if let Some(wrap) = &self.shared.wrap {
            // What the child offers beside tools is offered here too, and passed through.
            let child = wrap.child.capabilities();
            capabilities.resources = capability(&child, "resources");
            capabilities.prompts = capability(&child, "prompts");
            capabilities.completions = capability(&child, "completions");
            capabilities.logging = capability(&child, "logging");
            // The child's tool list is read again whenever it says it changed.
            if let Some(tools) = &mut capabilities.tools {
                tools.list_changed = Some(true);
            }
            if let Some(theirs) = wrap.child.instructions() {
                instructions = format!("{instructions}\n\n{theirs}");
            }
        }
        ServerConfig::new(capabilities)
            .with_server_info(
                Implementation::new("idemgate", env!("CARGO_PKG_VERSION"))
                    .with_title("idemgate")
                    .with_description("Side-effecting tools made safe to retry."),
            )
            .with_instructions(instructions)
    }

    async fn on_initialized(&self, context: rmcp::service::NotificationContext<RoleServer>) {
        self.attach_peer(&context.peer);
    }

    async fn on_roots_list_changed(&self, context: rmcp::service::NotificationContext<RoleServer>) {
        self.attach_peer(&context.peer);
        if let Some(wrap) = &self.shared.wrap {
            wrap.child.notify("notifications/roots/list_changed").await;
        }
    }

    async fn subscribe(
        &self,
        request: rmcp::model::SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let _: Value = self
            .forward("resources/subscribe", request, &context)
            .await?;
        Ok(())
    }

    async fn unsubscribe(
        &self,
        request: rmcp::model::UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let _: Value = self
            .forward("resources/unsubscribe", request, &context)
            .await?;
        Ok(())
    }

    #[allow(deprecated)] // logging: deprecated by the 2026-07-28 revision, still passed on
    async fn set_level(
        &self,
        request: rmcp::model::SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let _: Value = self.forward("logging/setLevel", request, &context).await?;
        Ok(())
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListResourcesResult, ErrorData> {
        self.forward("resources/list", request, &context).await
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListResourceTemplatesResult, ErrorData> {
        self.forward("resources/templates/list", request, &context)
            .await
    }

    async fn read_resource(
        &self,
        request: rmcp::model::ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ReadResourceResponse, ErrorData> {
        let result: rmcp::model::ReadResourceResult =
            self.forward("resources/read", request, &context).await?;
        Ok(result.into())
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListPromptsResult, ErrorData> {
        self.forward("prompts/list", request, &context).await
    }

    async fn get_prompt(
        &self,
        request: rmcp::model::GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetPromptResponse, ErrorData> {
        let result: rmcp::model::GetPromptResult =
            self.forward("prompts/get", request, &context).await?;
        Ok(result.into())
    }

    async fn complete(
        &self,
        request: rmcp::model::CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CompleteResult, ErrorData> {
        self.forward("completion/complete", request, &context).await
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        // The control tool is deliberately not listed: a model must not see it.
        self.attach_host(&context);
        Ok(ListToolsResult::with_all_items(
            self.shared.served().listed.clone(),
        ))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        let served = self.shared.served();
        if self.shared.wrap.is_some() {
            return served.listed.iter().find(|t| t.name == name).cloned();
        }
        if name == fake::CONTROL_TOOL && self.shared.fakes.is_some() {
            return Some(control_tool());
        }
        served.catalog.get(name).map(to_tool)
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let found = self.task_operation(&request.task_id, &context).await?;
        let (outcome, tool) = (&found.outcome, &found.tool);
        let stamp = |mut task: Task| {
            task.created_at = iso(found.created_at);
            task.last_updated_at = iso(found.updated_at);
            task
        };
        let base = Task::new(found.key.as_str(), rmcp::model::TaskStatus::Working, "", "");
        let (task, payload) = match as_task(outcome, self.shared.gateway.now()) {
            // Still in flight: the task keeps working.
            Some(task) => (stamp(task), TaskPayload::Working),
            // Settled (or refused): the task is complete, its result the tool result the
            // call would have answered.
            None => {
                let result = to_result(Reply::from_outcome(tool, outcome));
                let result = match serde_json::to_value(result) {
                    Ok(Value::Object(result)) => result,
                    _ => JsonObject::new(),
                };
                (stamp(base), TaskPayload::Completed { result })
            }
        };
        Ok(GetTaskResult::new(DetailedTask::new(task, payload)))
    }

    /// Acknowledged, never acted on: the operation's effect runs to a settled state whatever
    /// the caller does (DESIGN §3), so the task completes rather than being cancelled.
    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.task_operation(&request.task_id, &context)
            .await
            .map(|_| ())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        let arguments: JsonObject = request.arguments.clone().unwrap_or_default();
        let Some(caller) = self.caller(&context) else {
            // Unreachable behind McpHttpService, which refuses unauthenticated requests; kept
            // so that a different mounting fails closed.
            let outcome = Outcome::rejected(None, ErrorCode::Unauthorized, "no credentials");
            return Ok(to_result(Reply::from_outcome(&name, &outcome)).into());
        };
        if name == STATUS_TOOL {
            return Ok(to_result(self.status(&caller, &arguments).await).into());
        }
        if name == fake::CONTROL_TOOL
            && let Some(fakes) = &self.shared.fakes
        {
            let result = match fakes.control(&arguments) {
                Ok(stats) => {
                    let mut r = CallToolResult::structured(stats.clone());
                    r.content = vec![ContentBlock::text(format!(
                        "fake downstream {}: {} effects, {} calls",
                        stats["tool"], stats["effects"], stats["calls"]
                    ))];
                    r
                }
                Err(message) => CallToolResult::error(vec![ContentBlock::text(message)]),
            };
            return Ok(result.into());
        }
        self.attach_host(&context);
        if let Some(wrap) = &self.shared.wrap
            && let Some(why) = wrap.listing.gone(&name)
        {
            // A tool the child no longer lists (or lists under a name that cannot be served):
            // refused by name, nothing sent.
            let outcome = Outcome::rejected(None, ErrorCode::UnknownTool, why);
            return Ok(to_wrapped_result(wrapped::reply(&name, &outcome)).into());
        }
        let served = self.shared.served();
        let Some((contract, identity)) = served
            .catalog
            .get(&name)
            .and_then(|s| Some((s.contract.clone()?, s.identity)))
        else {
            return Err(ErrorData::invalid_params(
                format!("unknown tool `{name}`"),
                None,
            ));
        };
        // The operation identity comes from `_meta` only — set by the agent runtime, never by
        // the model, and never derived from the JSON-RPC id or a tool-call id. The SDK moves a
        // request's `_meta` into the context; the request's own copy is read as a fallback.
        let meta = request
            .meta
            .as_ref()
            .map(|m| &m.0.0)
            .filter(|m| m.contains_key(tools::OPERATION_META))
            .unwrap_or(&context.meta.0.0);
        let mut arguments = arguments;
        if let Some(wrap) = &self.shared.wrap
            && let Some(argument) = wrap.listing.key_argument(&name)
        {
            // idemgate fills this argument with the operation key; a value the model sends
            // anyway (a fresh one per call, as some servers ask) neither names the operation
            // nor reaches the child.
            arguments.remove(&argument);
        }
        let Some(loaded) = served.contracts.get(&contract) else {
            let outcome = Outcome::rejected(
                None,
                ErrorCode::UnknownTool,
                format!("no tool `{name}` is served here"),
            );
            return Ok(to_result(Reply::from_outcome(&name, &outcome)).into());
        };
        let session = self.session(&context);
        let named = self
            .name(
                loaded,
                identity,
                &caller,
                session.as_deref(),
                meta,
                &mut arguments,
            )
            .await;
        let (outcome, rule) = match named {
            Named::Refused(refused) => (refused, None),
            Named::Invoke {
                workflow_id,
                step_id,
                rule,
            } => {
                let arguments = Value::Object(arguments);
                // The child's progress for this call reaches the host under the host's token
                // while the host waits. The call is known to the child's side by the operation
                // key the executor makes of it (a read gets one of its own there), so it is
                // announced by that key, made here as the executor makes it.
                let _waiting = self.shared.wrap.as_ref().map(|wrap| {
                    let operation = match (loaded.effect_class, &workflow_id, &step_id) {
                        (EffectClass::Read, _, _) => None,
                        (_, Some(workflow), Some(step)) => OperationKey::new(
                            &caller.tenant,
                            self.shared.gateway.environment(),
                            workflow,
                            step,
                        )
                        .ok(),
                        _ => None,
                    };
                    let token = context
                        .meta
                        .get_progress_token()
                        .map(|t| serde_json::to_value(t).unwrap_or(Value::Null));
                    wrap.child
                        .expect_progress(&contract, &arguments, operation.as_ref(), token)
                });
                let invoke =
                    self.shared
                        .gateway
                        .invoke(caller, &contract, workflow_id, step_id, arguments);
                // A cancelled request stops the wait, never the effect: the delivery runs
                // detached to a settled record (DESIGN §3), which a repeat then reads.
                let outcome = tokio::select! {
                    outcome = invoke => outcome,
                    () = context.ct.cancelled() => {
                        return Err(ErrorData::internal_error(
                            "the request was cancelled; the operation settles on its own",
                            None,
                        ));
                    }
                };
                (outcome, rule)
            }
        };
        if context
            .client_capabilities()
            .is_some_and(|caps| caps.supports_tasks())
            && let Some(task) = as_task(&outcome, self.shared.gateway.now())
        {
            return Ok(CreateTaskResult::new(task).into());
        }
        if self.shared.wrap.is_some() {
            let mut reply = wrapped::reply(&name, &outcome);
            // The rule joins idemgate's own sentence, the last block, after the child's.
            if let Some(rule) = &rule
                && let Some(Value::String(text)) =
                    reply.content.last_mut().and_then(|b| b.get_mut("text"))
            {
                text.push(' ');
                text.push_str(&rule.sentence(outcome.operation_key.as_ref()));
            }
            let mut result = to_wrapped_result(reply);
            if let Some(rule) = rule {
                let mut meta = Map::new();
                meta.insert(tools::IDENTITY_META.to_string(), rule.as_json());
                result.meta = Some(MetaObject(meta));
            }
            return Ok(result.into());
        }
        let mut reply = Reply::from_outcome(&name, &outcome);
        if let Some(rule) = &rule {
            reply.text.push(' ');
            reply
                .text
                .push_str(&rule.sentence(outcome.operation_key.as_ref()));
        }
        let mut result = to_result(reply);
        if let Some(rule) = rule {
            let mut meta = Map::new();
            meta.insert(tools::IDENTITY_META.to_string(), rule.as_json());
            result.meta = Some(MetaObject(meta));
        }
        Ok(result.into())
    }
}

// ---------------------------------------------------------------------------------------------
// stdio.

/// Serves the gateway's tools over this process's stdin and stdout as `caller`, until the
/// client closes stdin or `shutdown` completes. Logs must go to stderr: stdout is the protocol.
pub async fn serve_stdio(
    gateway: Arc<dyn Gateway>,
    caller: Caller,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    serve_io(
        gateway,
        caller,
        options,
        tokio::io::stdin(),
        tokio::io::stdout(),
        shutdown,
    )
    .await
}

/// [`serve_stdio`] over any byte streams (newline-delimited JSON-RPC), for tests and embedding.
pub async fn serve_io<R, W>(
    gateway: Arc<dyn Gateway>,
    caller: Caller,
    options: Options,
    reader: R,
    writer: W,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error>
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    let handler = Handler {
        shared: Arc::new(Shared::new(gateway, options)?),
        who: Who::Fixed(caller),
        // No per-connection part over stdio (DESIGN §6): a host that restarts this server and
        // re-sends a call — the failure the window exists for — reaches the same operation.
        session: None,
    };
    let running = match handler.serve((reader, writer)).await {
        Ok(running) => running,
        // A client that connects and leaves before establishing a session (it had nothing to
        // call, say) ends the connection normally.
        Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => return Ok(()),
        Err(e) => return Err(Error::Start(e.to_string())),
    };
    let cancel = running.cancellation_token();
    let stopper = tokio::spawn(async move {
        shutdown.await;
        cancel.cancel();
    });
    let ended = running.waiting().await;
    stopper.abort();
    ended.map(|_| ()).map_err(|e| Error::Run(e.to_string()))
}

// ---------------------------------------------------------------------------------------------
// Streamable HTTP.

/// Settings of the streamable-HTTP service.
#[derive(Clone, Debug)]
pub struct HttpOptions {
    /// Accepted `Host` header values (`name` or `name:port`). The SDK's default is loopback
    /// only, a guard against DNS rebinding; a public deployment lists its own host names. An
    /// empty list accepts any host.
    pub allowed_hosts: Vec<String>,
    /// Keep MCP sessions in this process's memory (the pre-2026 session model). Off by
    /// default: every request is answered on its own, so any number of gateway processes
    /// behind a load balancer serve one client.
    pub sessions: bool,
    pub options: Options,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            allowed_hosts: vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
            sessions: false,
            options: Options::default(),
        }
    }
}

type Auth = dyn Fn(&http::request::Parts) -> Option<Caller> + Send + Sync;

/// The MCP streamable-HTTP endpoint as a tower service: authenticates each request with the
/// given function (401 when it answers `None`), then hands it to the SDK's service with the
/// caller attached. Mount it with `Router::nest_service("/mcp", service)`.
#[derive(Clone)]
pub struct McpHttpService {
    inner: StreamableHttpService<Handler, LocalSessionManager>,
    auth: Arc<Auth>,
}

impl std::fmt::Debug for McpHttpService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpHttpService").finish_non_exhaustive()
    }
}

impl McpHttpService {
    /// Ends open response streams and refuses new requests: call it when the server shuts
    /// down, or a graceful shutdown waits for streams that never end by themselves.
    pub fn shutdown(&self) {
        self.inner.config.cancellation_token.cancel();
    }
}

/// The streamable-HTTP MCP service over `gateway`. `auth` maps a request's head (its
/// `Authorization` header, say) to the caller, or `None` for a 401. `allowed_hosts` replaces
/// the SDK's loopback-only `Host` allow-list (see [`HttpOptions::allowed_hosts`]).
pub fn streamable_http_service(
    gateway: Arc<dyn Gateway>,
    auth: impl Fn(&http::request::Parts) -> Option<Caller> + Send + Sync + 'static,
    allowed_hosts: Vec<String>,
) -> Result<McpHttpService, Error> {
    streamable_http_service_with(
        gateway,
        auth,
        HttpOptions {
            allowed_hosts,
            ..HttpOptions::default()
        },
    )
}

/// [`streamable_http_service`] with every setting.
pub fn streamable_http_service_with(
    gateway: Arc<dyn Gateway>,
    auth: impl Fn(&http::request::Parts) -> Option<Caller> + Send + Sync + 'static,
    options: HttpOptions,
) -> Result<McpHttpService, Error> {
    let mut shared = Shared::new(gateway, options.options)?;
    shared.http_sessions = options.sessions;
    let shared = Arc::new(shared);
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(options.allowed_hosts)
        .with_legacy_session_mode(options.sessions)
        // One JSON answer per request where the handler sends nothing else first: tools here
        // never stream progress.
        .with_json_response(!options.sessions);
    let inner = StreamableHttpService::new(
        move || {
            Ok(Handler {
                shared: shared.clone(),
                who: Who::PerRequest,
                session: None,
            })
        },
        Arc::new(LocalSessionManager::default()),
        config,
    );
    Ok(McpHttpService {
        inner,
        auth: Arc::new(auth),
    })
}

/// The most of a refused request's body read before the refusal; past it the connection closes.
const UNREAD_BODY_LIMIT: usize = 64 * 1024;

fn unauthorized() -> Response<Body> {
    let outcome = Outcome::rejected(
        None,
        ErrorCode::Unauthorized,
        "a valid bearer token is required",
    );
    let body = serde_json::to_vec(&outcome).unwrap_or_default();
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = StatusCode::UNAUTHORIZED;
    let headers = response.headers_mut();
    headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

impl tower::Service<Request<Body>> for McpHttpService {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let (mut parts, body) = request.into_parts();
        // Every request is authenticated on its own, session or not, so a session id never
        // carries one tenant's identity into another's request.
        let Some(caller) = (self.auth)(&parts) else {
            return Box::pin(async move {
                // Read (a bounded amount of) the refused request's body first: an unread body
                // makes the server drop the connection, and a client that sent its next request
                // on it meanwhile sees a disconnect instead of this answer.
                let mut refusal = unauthorized();
                if axum::body::to_bytes(body, UNREAD_BODY_LIMIT).await.is_err() {
                    refusal
                        .headers_mut()
                        .insert(header::CONNECTION, HeaderValue::from_static("close"));
                }
                Ok(refusal)
            });
        };
        parts.extensions.insert(Authenticated(caller));
        let mut inner = self.inner.clone();
        Box::pin(async move {
            let response = match inner.call(Request::from_parts(parts, body)).await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            Ok(response.map(Body::new))
        })
    }
}
