//! API v1: the handlers. Each authenticates, checks its input, calls the executor, and
//! returns an [`Answer`] or an [`ApiError`]; `wire` turns those into HTTP.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use idemgate_app::Tool;
use idemgate_app::operations::Scope;
pub use idemgate_app::operations::{
    ApproveRequest, DEFAULT_REASON, DenyRequest, ListQuery, ReconcileRequest,
};
pub use idemgate_app::views::{
    EventView, OperationList, OperationSummary, OperationView, ReceiptView,
};
use idemgate_core::json;
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::{ErrorCode, Outcome, Repeatable};
use idemgate_engine::Caller;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::auth::{Principal, Role};
use crate::headers::{self, StepKey};
use crate::state::AppState;
use crate::wire::{Answer, ApiError, OutcomeView, Problem, WithOutcome};

pub const TAG: &str = "idemgate";

// ---------------------------------------------------------------------------------------------
// Shapes. The operations' read models and the operator's requests are the app's
// (`idemgate_app::views`, `idemgate_app::operations`), re-exported above: `idemgate ops
// --store` answers with the same ones. What follows is the HTTP face's own.

/// The body of an invocation. `workflow_id` and `step_id` name the operation (the calling
/// application's, never the model's); the `Idempotency-Key` header may name it instead.
#[derive(Debug, Deserialize, ToSchema)]
#[allow(dead_code)] // Documents the shape; bodies are read strictly by `json::parse`.
pub struct InvokeRequest {
    pub workflow_id: Option<String>,
    pub step_id: Option<String>,
    /// The tool's arguments, checked against its contract's input schema.
    #[schema(value_type = std::collections::BTreeMap<String, Value>)]
    pub arguments: Value,
}

/// An operator's resolution of an `unknown` operation, told apart by `resolution`. With no
/// body at all, the receipt is looked up now.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
#[schema(discriminator(property_name = "resolution", mapping(
    ("applied" = "#/components/schemas/ReconcileApplied"),
    ("not_applied" = "#/components/schemas/ReconcileNotApplied"),
    ("lookup" = "#/components/schemas/ReconcileLookup"),
)))]
pub enum ReconcileBody {
    Applied(ReconcileApplied),
    NotApplied(ReconcileNotApplied),
    Lookup(ReconcileLookup),
}

/// `resolution: applied`.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResolutionApplied {
    Applied,
}

/// `resolution: not_applied`.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResolutionNotApplied {
    NotApplied,
}

/// `resolution: lookup`.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResolutionLookup {
    Lookup,
}

/// The effect happened: its reference in the system of record, and the result later
/// deliveries replay.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReconcileApplied {
    pub resolution: ResolutionApplied,
    /// The downstream's reference of the effect (a ticket id, a provider request id).
    pub effect_reference: String,
    /// The replay-safe result, any JSON value; left out, it is null.
    #[schema(value_type = Value)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// Why, for the audit log (at most 500 characters); left out, "no reason given".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The effect did not happen: the key may run again.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReconcileNotApplied {
    pub resolution: ResolutionNotApplied,
    /// Why, for the audit log (at most 500 characters); left out, "no reason given".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Look the receipt up now (what no body does), giving a reason for the audit log.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReconcileLookup {
    pub resolution: ResolutionLookup,
    /// Why, for the audit log (at most 500 characters); left out, "no reason given".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// How a tool's operation is named: `required` (a key-based or irreversible tool needs
/// `workflow_id` and `step_id`, or an `Idempotency-Key`), `optional` (a natural-idempotent
/// tool), `ignored` (a read).
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OperationIdentity {
    Required,
    Optional,
    Ignored,
}

/// The contract's effect class.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EffectClassView {
    Read,
    NaturalIdempotent,
    KeyBased,
    Irreversible,
}

/// Whether an operator approves the tool's operations before their effect.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalView {
    Never,
    Always,
    /// Only calls whose arguments match the contract's `approval_when`.
    WhenMatches,
}

/// A loaded tool as a caller (or a framework adapter) needs it.
#[derive(Debug, Serialize, ToSchema)]
pub struct ToolView {
    /// The contract's name, as in `/v1/tools/{tool}/invoke`.
    pub name: String,
    pub version: String,
    /// The model-facing description: what it is for, when not to use it, what a repeat does.
    pub description: String,
    pub effect_class: EffectClassView,
    pub operation_identity: OperationIdentity,
    pub approval: ApprovalView,
    /// The JSON Schema of `arguments`.
    #[schema(value_type = std::collections::BTreeMap<String, Value>)]
    pub input_schema: Value,
}

/// Every loaded tool, ordered by name.
#[derive(Debug, Serialize, ToSchema)]
pub struct ToolList {
    pub tools: Vec<ToolView>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    pub status: String,
}

// ---------------------------------------------------------------------------------------------
// Helpers.

/// The one path parameter of a route, percent-decoded. A segment that does not decode (not
/// UTF-8) is refused as a problem like every other bad input, not axum's plain-text answer.
pub struct Segment(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Segment {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Segment, ApiError> {
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(segment)) => Ok(Segment(segment)),
            Err(e) => Err(invalid(format!("the path: {}", e.body_text()))),
        }
    }
}

fn authenticate(state: &AppState, headers: &HeaderMap) -> Result<Principal, ApiError> {
    state
        .inner()
        .tokens
        .current()
        .authenticate(headers)
        .map_err(ApiError::unauthenticated)
}

/// The executor's view of an authenticated principal.
fn caller_of(principal: &Principal) -> Caller {
    Caller {
        tenant: principal.tenant.clone(),
        actor: principal.name.clone(),
        role: principal.role.as_str().to_string(),
    }
}

fn operator(principal: &Principal) -> Result<(), ApiError> {
    match principal.role {
        Role::Operator => Ok(()),
        Role::Agent => Err(ApiError::new(
            ErrorCode::Forbidden,
            "this action needs an operator token",
        )),
    }
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::InvalidArguments, message)
}

/// Reads the body within the configured bound.
async fn read_body(state: &AppState, body: Body) -> Result<Bytes, ApiError> {
    let limit = state.inner().limits.body_bytes;
    axum::body::to_bytes(body, limit).await.map_err(|_| {
        invalid(format!("the request body is larger than {limit} bytes"))
            .with_status(StatusCode::PAYLOAD_TOO_LARGE)
    })
}

/// Parses a body strictly: UTF-8, no duplicate member names, I-JSON numbers, bounded depth.
fn parse_body(state: &AppState, bytes: &[u8]) -> Result<Value, ApiError> {
    json::parse_with_depth(bytes, state.inner().limits.json_depth).map_err(|e| invalid(e.message))
}

/// An optional operator body: empty means none.
fn optional_body<T: serde::de::DeserializeOwned>(
    state: &AppState,
    bytes: &[u8],
) -> Result<Option<T>, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let value = parse_body(state, bytes)?;
    serde_json::from_value(value)
        .map(Some)
        .map_err(|e| invalid(format!("request body: {}", strip_position(&e.to_string()))))
}

fn strip_position(message: &str) -> &str {
    message.split(" at line ").next().unwrap_or(message)
}

fn tool_view(tool: &Tool) -> ToolView {
    use idemgate_core::contract::{ApprovalRule, EffectClass};
    let c = &tool.contract;
    let (effect_class, operation_identity) = match c.effect_class {
        EffectClass::Read => (EffectClassView::Read, OperationIdentity::Ignored),
        EffectClass::NaturalIdempotent => (
            EffectClassView::NaturalIdempotent,
            OperationIdentity::Optional,
        ),
        EffectClass::KeyBased => (EffectClassView::KeyBased, OperationIdentity::Required),
        EffectClass::Irreversible => (EffectClassView::Irreversible, OperationIdentity::Required),
        // Refused at load; never a loaded tool. Shown as what it would need.
        EffectClass::NonIdempotent => (EffectClassView::KeyBased, OperationIdentity::Required),
    };
    let approval = match c.approval() {
        ApprovalRule::Never => ApprovalView::Never,
        ApprovalRule::Always => ApprovalView::Always,
        ApprovalRule::WhenMatches => ApprovalView::WhenMatches,
        ApprovalRule::Default => match c.effect_class {
            EffectClass::Irreversible => ApprovalView::Always,
            _ => ApprovalView::Never,
        },
    };
    ToolView {
        name: c.name.clone(),
        version: c.version.clone(),
        description: idemgate_core::describe::describe(c),
        effect_class,
        operation_identity,
        approval,
        input_schema: c.input_schema.clone(),
    }
}

/// The refusal for a tool that is not loaded: names it (bounded, printable) and points to the
/// listing.
fn unknown_tool(name: &str) -> ApiError {
    ApiError::new(ErrorCode::UnknownTool, unknown_tool_message(name))
}

fn unknown_tool_message(name: &str) -> String {
    let shown: String = name
        .chars()
        .take(100)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    format!("no tool named {shown:?} is loaded; GET /v1/tools lists the loaded tools")
}

// ---------------------------------------------------------------------------------------------
// Handlers.

/// The loaded tools: names, model-facing descriptions, input schemas and effect classes.
#[utoipa::path(
    get,
    path = "/v1/tools",
    tag = TAG,
    responses(
        (status = 200, description = "the loaded tools", body = ToolList),
        (status = 401, description = "missing or unaccepted token", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn list_tools(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<axum::Json<ToolList>, ApiError> {
    authenticate(&state, &headers)?;
    let tools = state.tools();
    let tools = tools
        .names()
        .iter()
        .filter_map(|n| tools.get(n))
        .map(|t| tool_view(&t))
        .collect();
    Ok(axum::Json(ToolList { tools }))
}

/// One loaded tool.
#[utoipa::path(
    get,
    path = "/v1/tools/{tool}",
    tag = TAG,
    params(("tool" = String, Path, description = "The tool's contract name.", example = "tickets.create")),
    responses(
        (status = 200, description = "the tool", body = ToolView),
        (status = 401, description = "missing or unaccepted token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "no such tool", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get_tool(
    State(state): State<AppState>,
    Segment(tool): Segment,
    headers: HeaderMap,
) -> Result<axum::Json<ToolView>, ApiError> {
    authenticate(&state, &headers)?;
    match state.tools().get(&tool) {
        Some(t) => Ok(axum::Json(tool_view(&t))),
        None => Err(unknown_tool(&tool)),
    }
}

/// Invoke a tool: at most one effect per operation, and a labelled outcome.
#[utoipa::path(
    post,
    path = "/v1/tools/{tool}/invoke",
    tag = TAG,
    params(
        ("tool" = String, Path, description = "The tool's contract name, e.g. `tickets.create`.", example = "tickets.create"),
        ("Idempotency-Key" = Option<String>, Header, description = "A structured-field string `\"<workflow_id>:<step_id>\"` (or the same unquoted: visible ASCII, no spaces or commas), instead of the body's fields; a value without `:`, such as a UUID, names workflow_id = value, step_id = `-`."),
        ("Prefer" = Option<String>, Header, description = "`wait=N`: wait up to N seconds for an in-flight operation to settle."),
    ),
    request_body(content = InvokeRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "applied, or replayed (`Idempotent-Replayed: true`)", body = OutcomeView),
        (status = 202, description = "unknown (reconcile), or in flight awaiting approval", body = OutcomeView),
        (status = 409, description = "in flight: poll after Retry-After", body = OutcomeView),
        (status = 400, description = "invalid request, arguments or key", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "missing or unaccepted token", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "authorization denied", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "unknown tool", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "the operation's record expired", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "body too large", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "key reused with a different request, or the downstream refused", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "store, downstream or authorization hook unavailable; nothing was sent", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn invoke(
    State(state): State<AppState>,
    Segment(tool): Segment,
    headers: HeaderMap,
    body: Body,
) -> Result<Answer, ApiError> {
    let principal = authenticate(&state, &headers)?;
    let caller = caller_of(&principal);
    let limits = state.inner().limits;
    // A header that is not a key names no operation: nothing can have run under it.
    let header_key = headers::idempotency_key(&headers, limits.key_part_bytes).map_err(|m| {
        ApiError::refused(&Outcome::refused(
            Repeatable::unnamed(),
            ErrorCode::InvalidOperationKey,
            m,
        ))
    })?;
    // From here on every refusal is the machine's answer for the operation the delivery named
    // (`refusal`). Until the body is read, only the header may have named one.
    let unread = || match &header_key {
        Some(step) => Named::Step(Some(step.clone())),
        None => Named::Unreadable,
    };
    let Some(tool) = state.tools().get(&tool) else {
        let message = unknown_tool_message(&tool);
        return Err(refusal(&state, &caller, unread(), ErrorCode::UnknownTool, message).await);
    };
    let bytes = match axum::body::to_bytes(body, limits.body_bytes).await {
        Ok(bytes) => bytes,
        Err(_) => {
            let message = format!(
                "the request body is larger than {} bytes",
                limits.body_bytes
            );
            let refused = refusal(
                &state,
                &caller,
                unread(),
                ErrorCode::InvalidArguments,
                message,
            );
            return Err(refused.await.with_status(StatusCode::PAYLOAD_TOO_LARGE));
        }
    };
    let envelope = match json::parse_with_depth(&bytes, limits.json_depth) {
        Ok(envelope) => envelope,
        Err(e) => {
            let code = ErrorCode::InvalidArguments;
            return Err(refusal(&state, &caller, unread(), code, e.message).await);
        }
    };
    // The body is read: what it names, with the header's, is all the delivery named.
    let Value::Object(mut members) = envelope else {
        let message =
            "the request body must be an object: {\"workflow_id\", \"step_id\", \"arguments\"}";
        let named = Named::of(None, header_key.as_ref());
        let code = ErrorCode::InvalidArguments;
        return Err(refusal(&state, &caller, named, code, message.into()).await);
    };
    let step = match step_of(&mut members, limits.key_part_bytes) {
        Ok(step) => step,
        Err(message) => {
            let named = Named::of(None, header_key.as_ref());
            let code = ErrorCode::InvalidOperationKey;
            return Err(refusal(&state, &caller, named, code, message).await);
        }
    };
    let named = || Named::of(step.as_ref(), header_key.as_ref());
    let Some(arguments) = members.remove("arguments") else {
        let message = "the request body needs `arguments`".to_string();
        let code = ErrorCode::InvalidArguments;
        return Err(refusal(&state, &caller, named(), code, message).await);
    };
    if let Some(name) = members.keys().next() {
        let shown: String = name.chars().take(64).collect();
        let message = format!(
            "the request body has an unknown member `{}`; it takes workflow_id, step_id and arguments",
            shown.escape_default()
        );
        let code = ErrorCode::InvalidArguments;
        return Err(refusal(&state, &caller, named(), code, message).await);
    }
    let step = match (step, header_key) {
        (Some(body), Some(header)) => {
            let message = "name the operation once: the Idempotency-Key header or the body's workflow_id and step_id";
            let named = Named::of(Some(&body), Some(&header));
            let code = ErrorCode::InvalidOperationKey;
            return Err(refusal(&state, &caller, named, code, message.into()).await);
        }
        (Some(s), None) | (None, Some(s)) => Some(s),
        (None, None) => None,
    };
    let wait = headers::prefer_wait(&headers, limits.max_wait_seconds).map(Duration::from_secs);
    let (workflow_id, step_id) = match step {
        Some(s) => (Some(s.workflow_id), Some(s.step_id)),
        None => (None, None),
    };
    // Detached: a client that disconnects only stops waiting; the claimed execution runs to a
    // settled state on its own task.
    let outcome = state
        .app()
        .invoke_waiting(
            caller,
            &tool.contract.name,
            workflow_id,
            step_id,
            arguments,
            wait,
        )
        .await;
    Ok(Answer(outcome))
}

/// What a delivery named as its operation, as far as it was read.
enum Named {
    /// The operation it named, or (`None`) that it readably named none.
    Step(Option<StepKey>),
    /// Not read far enough to know (a body too large or not JSON), or two different operations
    /// named at once: nothing can be proved about any key.
    Unreadable,
}

impl Named {
    /// What a read body (`body`) and the header (`header`) named together.
    fn of(body: Option<&StepKey>, header: Option<&StepKey>) -> Named {
        match (body, header) {
            (Some(body), Some(header)) if body != header => Named::Unreadable,
            (Some(step), _) | (None, Some(step)) => Named::Step(Some(step.clone())),
            (None, None) => Named::Step(None),
        }
    }
}

/// A refusal of a delivery before the executor ran it, as the machine answers it for what the
/// delivery named (`App::refuse`: the key is read, and `safe_to_repeat` holds only if it
/// provably had no effect), or, for a delivery not read far enough to know, a refusal that
/// claims nothing (`safe_to_repeat: false`).
async fn refusal(
    state: &AppState,
    caller: &Caller,
    named: Named,
    code: ErrorCode,
    message: String,
) -> ApiError {
    let outcome = match named {
        Named::Step(step) => {
            let (workflow_id, step_id) = match step {
                Some(s) => (Some(s.workflow_id), Some(s.step_id)),
                None => (None, None),
            };
            state
                .app()
                .refuse(caller.clone(), workflow_id, step_id, code, message)
                .await
        }
        Named::Unreadable => Outcome::rejected(None, code, message),
    };
    ApiError::refused(&outcome)
}

/// `workflow_id` and `step_id` from the body: both or neither, strings, bounded. An error is
/// the refusal's message (an invalid operation key).
fn step_of(members: &mut Map<String, Value>, max: usize) -> Result<Option<StepKey>, String> {
    let mut part = |name: &str| -> Result<Option<String>, String> {
        match members.remove(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => {
                headers::check_part(name, &s, max)?;
                Ok(Some(s))
            }
            Some(_) => Err(format!("{name} must be a string")),
        }
    };
    let workflow_id = part("workflow_id")?;
    let step_id = part("step_id")?;
    match (workflow_id, step_id) {
        (Some(workflow_id), Some(step_id)) => Ok(Some(StepKey {
            workflow_id,
            step_id,
        })),
        (None, None) => Ok(None),
        _ => Err("name both workflow_id and step_id, or neither".into()),
    }
}

/// An operation: record, receipt, the outcome a poll gives, and events. Polling advances an
/// accepted job; it never performs a new effect. Another tenant's key answers 404, exactly as
/// a missing one.
#[utoipa::path(
    get,
    path = "/v1/operations/{operation_key}",
    tag = TAG,
    params(("operation_key" = String, Path, description = "`tenant:environment:workflow_id:step_id`")),
    responses(
        (status = 200, description = "the operation; `Idempotency-Outcome` says its outcome", body = OperationView),
        (status = 401, description = "missing or unaccepted token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "no such operation for this tenant", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get_operation(
    State(state): State<AppState>,
    Segment(key): Segment,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let principal = authenticate(&state, &headers)?;
    // A key the token may not see answers 404, exactly as a missing one (the app decides).
    let view = state
        .app()
        .operation_view(&caller_of(&principal), &key)
        .await
        .map_err(ApiError::operator)?;
    Ok(WithOutcome(view.outcome.outcome.status(), view).into_response())
}

/// List the tenant's operations (operator). `status=unknown` is the reconciliation queue.
#[utoipa::path(
    get,
    path = "/v1/operations",
    tag = TAG,
    params(ListQuery),
    responses(
        (status = 200, description = "a page of operations, ordered by key", body = OperationList),
        (status = 400, description = "invalid filter", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "missing or unaccepted token", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "not an operator", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn list_operations(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<axum::Json<OperationList>, ApiError> {
    let principal = authenticate(&state, &headers)?;
    operator(&principal)?;
    let Query(query) = query.map_err(|e| invalid(format!("query: {}", e.body_text())))?;
    let page = state
        .app()
        .operation_list(Scope::Tenant(principal.tenant), query)
        .await
        .map_err(ApiError::operator)?;
    Ok(axum::Json(page))
}

/// Reconcile an `unknown` operation (operator). No body: look the receipt up now. A body
/// records the operator's resolution, with the operator as actor.
#[utoipa::path(
    post,
    path = "/v1/operations/{operation_key}/reconcile",
    tag = TAG,
    params(("operation_key" = String, Path, description = "`tenant:environment:workflow_id:step_id`")),
    request_body(content = ReconcileBody, content_type = "application/json", description = "Optional: without a body, the receipt is looked up now; `resolution: lookup` does the same and records a `reason`. `applied` and `not_applied` settle the record as the operator found it."),
    responses(
        (status = 200, description = "settled as applied (replayed from now on)", body = OutcomeView),
        (status = 202, description = "still unknown (no receipt yet)", body = OutcomeView),
        (status = 409, description = "not applied: the key may run again", body = OutcomeView),
        (status = 400, description = "invalid body", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "missing or unaccepted token", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "not an operator", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "no such operation", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "body too large", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "the operation is not unknown, or has no receipt lookup", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn reconcile(
    State(state): State<AppState>,
    Segment(key): Segment,
    headers: HeaderMap,
    body: Body,
) -> Result<Answer, ApiError> {
    let principal = authenticate(&state, &headers)?;
    operator(&principal)?;
    let bytes = read_body(&state, body).await?;
    let request = optional_body::<ReconcileRequest>(&state, &bytes)?;
    let outcome = state
        .app()
        .reconcile_request(&caller_of(&principal), &key, request)
        .await;
    outcome.map(Answer).map_err(ApiError::operator)
}

/// Approve an operation awaiting approval (operator): the effect then runs, with the original
/// caller's authorization rechecked. Single-use; bound to the fingerprint when one is given.
#[utoipa::path(
    post,
    path = "/v1/operations/{operation_key}/approve",
    tag = TAG,
    params(("operation_key" = String, Path, description = "`tenant:environment:workflow_id:step_id`")),
    request_body(content = ApproveRequest, content_type = "application/json", description = "Optional."),
    responses(
        (status = 200, description = "approved and applied", body = OutcomeView),
        (status = 202, description = "approved; the outcome is unknown", body = OutcomeView),
        (status = 409, description = "approved; in flight", body = OutcomeView),
        (status = 400, description = "invalid body", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "missing or unaccepted token", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "not an operator, or authorization denied", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "no such operation", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "body too large", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "not awaiting approval, or a different request", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn approve(
    State(state): State<AppState>,
    Segment(key): Segment,
    headers: HeaderMap,
    body: Body,
) -> Result<Answer, ApiError> {
    let principal = authenticate(&state, &headers)?;
    operator(&principal)?;
    let bytes = read_body(&state, body).await?;
    let request = optional_body::<ApproveRequest>(&state, &bytes)?.unwrap_or_default();
    let outcome = state
        .app()
        .approve_request(&caller_of(&principal), &key, request)
        .await;
    outcome.map(Answer).map_err(ApiError::operator)
}

/// Deny an operation awaiting approval (operator): every later delivery replays the refusal.
#[utoipa::path(
    post,
    path = "/v1/operations/{operation_key}/deny",
    tag = TAG,
    params(("operation_key" = String, Path, description = "`tenant:environment:workflow_id:step_id`")),
    request_body(content = DenyRequest, content_type = "application/json", description = "Optional."),
    responses(
        (status = 403, description = "denied (the refusal, as every later delivery sees it), or not an operator", body = Problem, content_type = "application/problem+json"),
        (status = 400, description = "invalid body", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "missing or unaccepted token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "no such operation", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "body too large", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "not awaiting approval", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn deny(
    State(state): State<AppState>,
    Segment(key): Segment,
    headers: HeaderMap,
    body: Body,
) -> Result<Answer, ApiError> {
    let principal = authenticate(&state, &headers)?;
    operator(&principal)?;
    let bytes = read_body(&state, body).await?;
    let request = optional_body::<DenyRequest>(&state, &bytes)?.unwrap_or_default();
    let outcome = state
        .app()
        .deny_request(&caller_of(&principal), &key, request)
        .await;
    outcome.map(Answer).map_err(ApiError::operator)
}

/// Liveness and store reachability.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = TAG,
    responses(
        (status = 200, description = "serving", body = Health),
        (status = 503, description = "the store is unreachable", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn healthz(State(state): State<AppState>) -> Result<axum::Json<Health>, ApiError> {
    let probe = OperationKey::new("-", "-", "healthz", "-").expect("a valid key");
    state
        .executor()
        .store()
        .get(&probe)
        .await
        .map_err(|e| ApiError::store(&e))?;
    Ok(axum::Json(Health {
        status: "ok".into(),
    }))
}

/// Prometheus metrics.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = TAG,
    responses((status = 200, description = "Prometheus text exposition", body = String, content_type = "text/plain"))
)]
pub async fn metrics(State(state): State<AppState>) -> Response {
    state
        .inner()
        .queue_gauge
        .ensure_started(
            state.executor().store().clone(),
            state.environment().to_string(),
        )
        .await;
    let text = crate::metrics::handle()
        .map(|h| h.render())
        .unwrap_or_default();
    let mut r = text.into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

/// Unknown paths answer a problem, like every other refusal.
pub async fn fallback() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such resource")
}

/// A known path with a method it does not serve: a problem too, 405.
pub async fn method_not_allowed() -> ApiError {
    ApiError::new(
        ErrorCode::NotFound,
        "this resource does not answer that method; /openapi.json lists the methods",
    )
    .with_status(StatusCode::METHOD_NOT_ALLOWED)
}
