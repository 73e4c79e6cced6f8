//! `idemgate ops`: the operators' actions against a running gateway, over its API v1
//! (`/v1/operations…`; by default the local gateway at [`DEFAULT_GATEWAY`]), or with
//! `--store URL` on a store directly, without a gateway: the store is opened here and every
//! answer is the app's own, the one API v1 sends (`idemgate_app`'s operator answers over an
//! `App`: the same read models, the same refusals), so output and exit statuses are the same
//! either way: with no HTTP in between, an answer still carries the status API v1 would send,
//! and a refusal its problem document (`idemgate_app::problems`, which the server sends too),
//! so a refusal reads `(404 not_found)` and `--json` prints the same document. Over a store,
//! records of a tool not loaded here (`--contracts`) — a tool of an in-process
//! `idemgate.Local`, say — are resolved by hand (`reconcile --applied --reference REF`,
//! `--not-applied`, `deny`), never looked up.
//!
//! - `list` — a page of the tenant's operations; by default the reconciliation queue
//!   (`status=unknown`), with the next page's cursor.
//! - `show KEY` — the record, the receipt, the outcome a caller gets now, and the timeline.
//! - `approve`, `deny`, `reconcile` — each reads the operation first (so a missing key or a key
//!   of another tenant is refused before anything is sent), sends the action, reads the
//!   operation again and prints what changed. A refusal is checked the same way: the second
//!   read proves that nothing changed.
//!
//! The token comes only from `IDEMGATE_TOKEN`: an argument would show in `ps` and in shell
//! history. `--json` prints the gateway's own JSON answer, one document, for scripts.
//!
//! Exit statuses follow `main.rs`: 0 done; 1 the command ran but settled nothing (a receipt
//! lookup that found no receipt); 2 it could not do its job (gateway down, token refused, no
//! such operation, an action that does not apply to the operation's state) — and then nothing
//! changed.
//!
//! This client never retries an action on its own: a POST whose answer is lost may have been
//! applied, so it says so and points to `show` instead of sending it again.

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use comfy_table::{Table, presets};
use idemgate_app::OperatorError;
use idemgate_app::operations::{ListQuery, Scope};
use idemgate_app::problems::{self, Problem};
use idemgate_app::views::OutcomeView as Labelled;
use idemgate_core::outcome::{Outcome, Status};
use reqwest::{Method, StatusCode, Url};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Where the token is read from; never from an argument.
pub const TOKEN_VAR: &str = "IDEMGATE_TOKEN";

/// The gateway `ops` talks to when neither `--gateway` nor `--store` names one: where
/// `idemgate serve` listens by default.
pub const DEFAULT_GATEWAY: &str = "http://127.0.0.1:8080";

/// Who acts, over a store: this variable, else the login name (`USER`), else "operator".
pub const ACTOR_VAR: &str = "IDEMGATE_ACTOR";

/// An answer may come only after an approved effect ran (the gateway waits for it a while): long
/// enough for that, and still bounded.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Flags of `idemgate ops`.
#[derive(Debug, clap::Args)]
pub struct OpsArgs {
    /// The gateway's base URL (default http://127.0.0.1:8080, where `idemgate serve`
    /// listens). The token is read from IDEMGATE_TOKEN.
    #[arg(long, env = "IDEMGATE_GATEWAY", value_name = "URL", global = true)]
    gateway: Option<String>,
    /// Act on this store directly, without a gateway: sqlite://PATH or postgres://… (no token;
    /// whoever can open the store is its operator). The actor recorded is IDEMGATE_ACTOR, else
    /// the login name.
    #[arg(long, value_name = "URL", global = true, conflicts_with = "gateway")]
    store: Option<String>,
    /// With --store: contracts (glob patterns) whose tools are served here, so that their
    /// receipts can be looked up and their approvals run. Records of other tools can only be
    /// resolved by hand or denied.
    #[arg(long, value_name = "PATTERN", global = true)]
    contracts: Vec<String>,
    /// With --store: the variable holding the key the store's requests and results are
    /// encrypted with (the gateway's `encryption_key_env`).
    #[arg(long, value_name = "VAR", global = true)]
    encryption_key_env: Option<String>,
    /// Print the gateway's JSON answer (one document) instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// List operations; by default the reconciliation queue (status unknown).
    List(ListArgs),
    /// Show an operation: the record, the receipt, the outcome a caller gets now, the timeline.
    Show {
        /// The operation key, `tenant:environment:workflow_id:step_id`.
        #[arg(value_parser = operation_key)]
        key: String,
    },
    /// Approve an operation awaiting approval: its effect then runs once.
    Approve {
        #[arg(value_parser = operation_key)]
        key: String,
        /// Approve only if the operation is still this exact request (`sha256:…`, as `show`
        /// prints it).
        #[arg(long, value_name = "F")]
        fingerprint: Option<String>,
        /// Why; recorded in the audit log with the operator's name (the gateway records "no
        /// reason given" without it).
        #[arg(long, value_name = "R", value_parser = non_empty)]
        reason: Option<String>,
    },
    /// Deny an operation awaiting approval: every later delivery gets the refusal.
    Deny {
        #[arg(value_parser = operation_key)]
        key: String,
        /// Why; recorded with the operator's name.
        #[arg(long, value_name = "R", value_parser = non_empty)]
        reason: String,
    },
    /// Settle an operation whose outcome is unknown: look its receipt up now, or record what
    /// the system of record says (--applied --reference REF, or --not-applied).
    Reconcile(ReconcileArgs),
}

#[derive(Debug, clap::Args)]
struct ListArgs {
    /// unknown (the reconciliation queue), awaiting_approval, pending, applied,
    /// failed_permanent, tombstone, or all.
    #[arg(long, default_value = "unknown", value_parser = [
        "unknown", "awaiting_approval", "pending", "applied", "failed_permanent", "tombstone", "all",
    ])]
    status: String,
    /// Only this tool's operations.
    #[arg(long)]
    tool: Option<String>,
    /// At most this many (1 to 500; the gateway's default is 100).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=500))]
    limit: Option<u16>,
    /// Start after this key: the cursor the previous page printed.
    #[arg(long, value_name = "KEY")]
    after: Option<String>,
    /// With --store: only this tenant's operations (a gateway lists its token's tenant).
    #[arg(long)]
    tenant: Option<String>,
    /// With --store: only this environment's operations (a gateway lists its own).
    #[arg(long)]
    environment: Option<String>,
}

#[derive(Debug, clap::Args)]
struct ReconcileArgs {
    #[arg(value_parser = operation_key)]
    key: String,
    /// The effect happened: record it with --reference (and optionally --result).
    #[arg(long, requires = "reference", conflicts_with = "not_applied")]
    applied: bool,
    /// The downstream's reference for the effect (ticket id, request id).
    #[arg(long, value_name = "REF", requires = "applied", value_parser = non_empty)]
    reference: Option<String>,
    /// The result callers get on replay, as JSON.
    #[arg(long, value_name = "JSON", requires = "applied")]
    result: Option<String>,
    /// The effect did not happen: the key may run again. Asks for confirmation.
    #[arg(long)]
    not_applied: bool,
    /// Do not ask for confirmation of --not-applied (for scripts).
    #[arg(long, requires = "not_applied")]
    yes: bool,
    /// Why; recorded in the audit log with the operator's name (the gateway records "no
    /// reason given" without it).
    #[arg(long, value_name = "R", value_parser = non_empty)]
    reason: Option<String>,
}

/// A key has four non-empty parts; the gateway judges the rest (and answers 404 for a key of
/// another tenant exactly as for a missing one).
fn operation_key(text: &str) -> Result<String, String> {
    let parts: Vec<&str> = text.splitn(4, ':').collect();
    if parts.len() == 4 && parts.iter().all(|p| !p.is_empty()) {
        Ok(text.to_string())
    } else {
        Err("an operation key is tenant:environment:workflow_id:step_id".into())
    }
}

fn non_empty(text: &str) -> Result<String, String> {
    if text.trim().is_empty() {
        Err("must not be empty".into())
    } else {
        Ok(text.to_string())
    }
}

// ---------------------------------------------------------------------------------------------
// The gateway's shapes, as this client reads them (the app's read models,
// crates/app/src/views.rs, and its problem documents, crates/app/src/problems.rs).

#[derive(Debug, Clone, Deserialize, PartialEq)]
struct Summary {
    operation_key: String,
    tool: String,
    #[serde(default)]
    tool_version: String,
    record_status: String,
    #[serde(default)]
    fingerprint: String,
    attempt: u64,
    effect_reference: Option<String>,
    job_id: Option<String>,
    approved_by: Option<String>,
    created_at: i64,
    updated_at: i64,
    /// Null while the operation has not settled (its retention counts from settlement).
    #[serde(default)]
    expires_at: Option<i64>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
struct ReceiptView {
    reference: String,
    #[serde(default)]
    result: Value,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
struct EventView {
    kind: String,
    at: i64,
    attempt: u64,
    worker: String,
    detail: Option<String>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
struct ErrorView {
    code: String,
    message: String,
}

/// An outcome body, or the outcome members of a problem.
#[derive(Debug, Clone, Deserialize, PartialEq)]
struct OutcomeView {
    outcome: String,
    operation_key: Option<String>,
    effect_reference: Option<String>,
    #[serde(default)]
    safe_to_repeat: bool,
    next_action: String,
    retry_after_seconds: Option<u64>,
    result: Option<Value>,
    error: Option<ErrorView>,
    /// Only in a problem: the explanation.
    #[serde(default)]
    detail: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
struct OperationView {
    #[serde(flatten)]
    record: Summary,
    receipt: Option<ReceiptView>,
    outcome: OutcomeView,
    #[serde(default)]
    events: Vec<EventView>,
}

#[derive(Debug, Deserialize)]
struct OperationList {
    operations: Vec<Summary>,
    next_after: Option<String>,
}

// ---------------------------------------------------------------------------------------------
// The client.

/// One answer of the gateway, or of the app over a store (with the status API v1 answers).
#[derive(Debug)]
struct Reply {
    status: StatusCode,
    /// An RFC 9457 problem (`application/problem+json`): a rejection.
    problem: bool,
    body: Value,
    /// The body as the gateway wrote it, for `--json`.
    raw: String,
}

impl Reply {
    fn code(&self) -> Option<&str> {
        self.body.pointer("/error/code").and_then(Value::as_str)
    }

    fn detail(&self) -> String {
        self.body
            .get("detail")
            .and_then(Value::as_str)
            .or_else(|| self.body.pointer("/error/message").and_then(Value::as_str))
            .unwrap_or("no detail given")
            .to_string()
    }

    /// "404 not_found".
    fn label(&self) -> String {
        match self.code() {
            Some(code) => format!("{} {code}", self.status.as_u16()),
            None => self.status.as_u16().to_string(),
        }
    }
}

struct Client {
    base: Url,
    token: String,
    http: reqwest::Client,
}

impl Client {
    fn new(gateway: Option<&str>) -> anyhow::Result<Client> {
        let gateway = gateway.unwrap_or(DEFAULT_GATEWAY);
        let mut base = Url::parse(gateway.trim())
            .map_err(|e| anyhow!("--gateway {gateway:?} is not a URL ({e})"))?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            bail!("--gateway {gateway:?} must be an http:// or https:// URL");
        }
        if base.query().is_some() || base.fragment().is_some() {
            bail!("--gateway {gateway:?} must not carry a query or fragment");
        }
        // Paths are appended segment by segment: a base behind a prefix keeps its prefix.
        if let Ok(mut segments) = base.path_segments_mut() {
            segments.pop_if_empty();
        }
        let token = match std::env::var(TOKEN_VAR) {
            Ok(t) if !t.trim().is_empty() => t.trim().to_string(),
            Ok(_) | Err(std::env::VarError::NotPresent) => bail!(
                "set {TOKEN_VAR} to an operator token of the gateway (`idemgate token new \
                 --role operator` mints one); a token is never taken from an argument"
            ),
            Err(std::env::VarError::NotUnicode(_)) => bail!("{TOKEN_VAR} is not valid UTF-8"),
        };
        idemgate_downstream_http::install_crypto_provider();
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(ANSWER_TIMEOUT)
            // A redirect could carry the token elsewhere, and turn a POST into a GET.
            .redirect(reqwest::redirect::Policy::none())
            .tls_backend_rustls()
            .build()
            .context("building the HTTP client")?;
        Ok(Client { base, token, http })
    }

    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            // Each segment is percent-encoded: a key may hold `/`, `?` or `#`.
            path.extend(segments);
        }
        url
    }

    /// Sends one request; connection failures and non-JSON answers are errors here, every
    /// answer of the gateway (refusals too) is a [`Reply`].
    async fn send(
        &self,
        method: Method,
        segments: &[&str],
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> anyhow::Result<Reply> {
        let mut url = self.url(segments);
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        let posting = method == Method::POST;
        let mut request = self.http.request(method, url).bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(body);
        } else if posting {
            request = request.header(reqwest::header::CONTENT_LENGTH, "0");
        }
        let response = request.send().await.map_err(|e| {
            if e.is_connect() {
                anyhow!(
                    "cannot reach the gateway at {}: {} (is `idemgate serve` running there? \
                     --gateway URL names another, --store URL acts on a store directly); \
                     nothing was sent",
                    self.base,
                    cause(&e)
                )
            } else if posting {
                // The request may have arrived: an action must not be resent blindly.
                anyhow!(
                    "no answer from the gateway at {} ({}): the action may or may not have \
                     been applied; run `idemgate ops show` to see the operation before trying again",
                    self.base,
                    cause(&e)
                )
            } else {
                anyhow!("no answer from the gateway at {}: {}", self.base, cause(&e))
            }
        })?;
        let status = response.status();
        let problem = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/problem+json"));
        let bytes = response
            .bytes()
            .await
            .map_err(|e| anyhow!("reading the gateway's answer: {}", cause(&e)))?;
        let body: Value = serde_json::from_slice(&bytes).map_err(|_| {
            anyhow!(
                "the gateway at {} answered {status} with a body that is not JSON; is it an \
                 idemgate gateway?",
                self.base
            )
        })?;
        Ok(Reply {
            status,
            problem,
            body,
            raw: String::from_utf8_lossy(&bytes).into_owned(),
        })
    }

    /// The error for a refused request, naming what was wrong.
    async fn refusal(&self, reply: &Reply, key: Option<&str>, needs: Needs) -> anyhow::Error {
        let detail = reply.detail();
        let label = reply.label();
        let (action, operator_only) = match needs {
            Needs::AnyToken(action) => (action, false),
            Needs::Operator(action) => (action, true),
        };
        match (reply.status.as_u16(), reply.code()) {
            (401, _) => anyhow!(
                "the gateway refused the token in {TOKEN_VAR} ({label}: {detail}); it is not one \
                 of this gateway's tokens"
            ),
            // An agent may read its own operations: a 403 there is the tool's authorization
            // check, never the role.
            (403, Some("forbidden")) if operator_only => match self.is_operator().await {
                Some(false) => anyhow!(
                    "the token in {TOKEN_VAR} is an agent token; {action} needs an operator \
                     token ({label}); nothing changed"
                ),
                _ => anyhow!("{action} was refused ({label}): {detail}; nothing changed"),
            },
            (404, Some("not_found")) if key.is_some() => anyhow!(
                "no operation {} for this token's tenant ({label}): it does not exist, or it \
                 belongs to another tenant or environment",
                key.unwrap_or_default()
            ),
            (503, _) => anyhow!(
                "{action}: the gateway is unavailable ({label}): {detail}; nothing changed, \
                 retry later"
            ),
            _ => anyhow!("{action} was refused ({label}): {detail}; nothing changed"),
        }
    }

    /// Whether the token is an operator's: listing is for operators only. `None` when the
    /// probe itself failed.
    async fn is_operator(&self) -> Option<bool> {
        let reply = self
            .send(
                Method::GET,
                &["v1", "operations"],
                &[("limit", "1".into())],
                None,
            )
            .await
            .ok()?;
        match (reply.status.as_u16(), reply.code()) {
            (200, _) => Some(true),
            (403, Some("forbidden")) => Some(false),
            _ => None,
        }
    }
}

/// What a refused request needed, for its message.
#[derive(Debug, Clone, Copy)]
enum Needs {
    AnyToken(&'static str),
    Operator(&'static str),
}

/// The innermost cause of a transport error, which names the refusal or the timeout.
fn cause(e: &reqwest::Error) -> String {
    let mut source: &dyn std::error::Error = e;
    while let Some(next) = source.source() {
        source = next;
    }
    if e.is_timeout() {
        format!("timed out ({source})")
    } else {
        source.to_string()
    }
}

// ---------------------------------------------------------------------------------------------
// A store, without a gateway.

/// A store opened here, answering as API v1 would.
struct Local {
    app: idemgate_app::App,
    url: String,
    actor: String,
    /// `list`'s scope: every tenant and environment unless narrowed.
    tenant: Option<String>,
    environment: Option<String>,
}

impl Local {
    /// Opens the store and the tools of `contracts`, for actions in `environment` (a key's, or
    /// the listing's when it names one).
    async fn open(args: &OpsArgs, url: &str, environment: &str) -> anyhow::Result<Local> {
        use idemgate_app::{Assembly, HttpEffects, ToolSet, contracts};
        let tools = if args.contracts.is_empty() {
            ToolSet::default()
        } else {
            let loaded = contracts::load(&args.contracts, std::path::Path::new(""))?;
            ToolSet::build(loaded, &HttpEffects)?
        };
        let store = idemgate_app::open_gateway_store(url, args.encryption_key_env.as_deref())
            .await
            .map_err(|e| anyhow!("{e}; nothing changed"))?;
        let app = Assembly::new(store, tools, environment).build();
        let actor = [ACTOR_VAR, "USER"]
            .iter()
            .filter_map(|var| std::env::var(var).ok())
            .map(|name| name.trim().to_string())
            .find(|name| !name.is_empty())
            .unwrap_or_else(|| "operator".into());
        Ok(Local {
            app,
            url: idemgate_app::redact(url),
            actor,
            tenant: None,
            environment: None,
        })
    }

    /// An operator of the key's tenant: over a store, every tenant's keys are at hand.
    fn caller(&self, key: &str) -> idemgate_engine::Caller {
        idemgate_engine::Caller {
            tenant: key.split(':').next().unwrap_or_default().to_string(),
            actor: self.actor.clone(),
            role: "operator".into(),
        }
    }

    async fn list(&self, query: &[(&str, String)]) -> anyhow::Result<Reply> {
        let find = |name: &str| {
            query
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
        };
        let asked = ListQuery {
            status: find("status"),
            tool: find("tool"),
            after: find("after"),
            limit: find("limit").and_then(|l| l.parse().ok()),
        };
        let scope = Scope::Store {
            tenant: self.tenant.clone(),
            environment: self.environment.clone(),
        };
        Reply::read(self.app.operation_list(scope, asked).await)
    }

    async fn get(&self, key: &str) -> anyhow::Result<Reply> {
        Reply::read(self.app.operation_view(&self.caller(key), key).await)
    }

    async fn post(&self, key: &str, action: &str, body: Option<&Value>) -> anyhow::Result<Reply> {
        fn read<T: serde::de::DeserializeOwned>(body: &Value) -> anyhow::Result<T> {
            serde_json::from_value(body.clone())
                .map_err(|e| anyhow!("the action's body does not read: {e}"))
        }
        let caller = self.caller(key);
        let app = &self.app;
        let answer = match (action, body) {
            ("approve", None) => app.approve_request(&caller, key, Default::default()).await,
            ("approve", Some(b)) => app.approve_request(&caller, key, read(b)?).await,
            ("deny", None) => app.deny_request(&caller, key, Default::default()).await,
            ("deny", Some(b)) => app.deny_request(&caller, key, read(b)?).await,
            (_, None) => app.reconcile_request(&caller, key, None).await,
            (_, Some(b)) => app.reconcile_request(&caller, key, Some(read(b)?)).await,
        };
        match answer {
            Ok(outcome) => Reply::outcome(&outcome),
            Err(e) => Reply::refusal(e),
        }
    }
}

impl Reply {
    /// A read made here: the read model as API v1 sends it, or the refusal.
    fn read<T: Serialize>(answer: Result<T, OperatorError>) -> anyhow::Result<Reply> {
        match answer {
            Ok(view) => Reply::made(200, false, &view),
            Err(e) => Reply::refusal(e),
        }
    }

    /// An action's outcome made here, as API v1 answers it: with its status, and a rejection
    /// (a denial's, say) as a problem document.
    fn outcome(outcome: &Outcome) -> anyhow::Result<Reply> {
        let status = problems::outcome_status(outcome);
        if outcome.status == Status::Rejected {
            // Made without a gateway, the problem's type is the relative `/problems/<code>`.
            Reply::made(status, true, &Problem::of(outcome, status, ""))
        } else {
            Reply::made(status, false, &Labelled::from(outcome))
        }
    }

    /// A refusal made here: API v1's status and problem document.
    fn refusal(e: OperatorError) -> anyhow::Result<Reply> {
        Reply::made(e.status(), true, &e.problem(""))
    }

    fn made(status: u16, problem: bool, answer: &impl Serialize) -> anyhow::Result<Reply> {
        let raw = serde_json::to_string(answer).context("writing an answer")?;
        let body = serde_json::from_str(&raw).context("an answer that is not JSON")?;
        Ok(Reply {
            status: StatusCode::from_u16(status).context("an answer with an unknown status")?,
            problem,
            body,
            raw,
        })
    }
}

/// Where the operator's commands go: a gateway, or a store opened here.
enum Target {
    Gateway(Client),
    Store(Local),
}

impl Target {
    async fn list(&self, query: &[(&str, String)]) -> anyhow::Result<Reply> {
        match self {
            Target::Gateway(client) => {
                client
                    .send(Method::GET, &["v1", "operations"], query, None)
                    .await
            }
            Target::Store(local) => local.list(query).await,
        }
    }

    async fn post(&self, key: &str, action: &str, body: Option<&Value>) -> anyhow::Result<Reply> {
        match self {
            Target::Gateway(client) => {
                client
                    .send(Method::POST, &["v1", "operations", key, action], &[], body)
                    .await
            }
            Target::Store(local) => local.post(key, action, body).await,
        }
    }

    async fn get_operation(&self, key: &str) -> anyhow::Result<(OperationView, String)> {
        let reply = match self {
            Target::Gateway(client) => {
                client
                    .send(Method::GET, &["v1", "operations", key], &[], None)
                    .await?
            }
            Target::Store(local) => local.get(key).await?,
        };
        if !reply.status.is_success() {
            let reading = Needs::AnyToken("reading the operation");
            return Err(self.refusal(&reply, Some(key), reading).await);
        }
        let view = serde_json::from_value(reply.body.clone())
            .context("the operation does not have the expected shape")?;
        Ok((view, reply.raw))
    }

    /// The error for a refused request, naming what was wrong.
    async fn refusal(&self, reply: &Reply, key: Option<&str>, needs: Needs) -> anyhow::Error {
        let local = match self {
            Target::Gateway(client) => return client.refusal(reply, key, needs).await,
            Target::Store(local) => local,
        };
        let detail = reply.detail();
        let label = reply.label();
        let action = match needs {
            Needs::AnyToken(action) | Needs::Operator(action) => action,
        };
        match (reply.status.as_u16(), reply.code()) {
            (404, Some("not_found")) if key.is_some() => anyhow!(
                "no operation {} in the store {} ({label})",
                key.unwrap_or_default(),
                local.url
            ),
            (503, _) => anyhow!(
                "{action}: the store {} is unavailable ({label}): {detail}; nothing changed, \
                 retry later",
                local.url
            ),
            _ if detail.contains("is not loaded here") => anyhow!(
                "{action} was refused ({label}): {detail} (--contracts PATTERN loads the tool's \
                 contract here); nothing changed"
            ),
            _ => anyhow!("{action} was refused ({label}): {detail}; nothing changed"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The commands.

pub async fn run(args: OpsArgs) -> anyhow::Result<ExitCode> {
    if args.store.is_none() {
        let store_only = [
            ("--contracts", !args.contracts.is_empty()),
            ("--encryption-key-env", args.encryption_key_env.is_some()),
            (
                "--tenant",
                matches!(&args.command, Command::List(l) if l.tenant.is_some()),
            ),
            (
                "--environment",
                matches!(&args.command, Command::List(l) if l.environment.is_some()),
            ),
        ];
        if let Some((flag, _)) = store_only.iter().find(|(_, given)| *given) {
            bail!(
                "{flag} applies only with --store URL (a gateway has its own contracts, key, \
                 tenant and environment); nothing was sent"
            );
        }
    }
    let client = match &args.store {
        None => Target::Gateway(Client::new(args.gateway.as_deref())?),
        Some(url) => {
            // One key's environment, or the listing's (any name serves a listing of all).
            let environment = match &args.command {
                Command::List(list) => list.environment.clone().unwrap_or_else(|| "-".into()),
                Command::Show { key }
                | Command::Approve { key, .. }
                | Command::Deny { key, .. }
                | Command::Reconcile(ReconcileArgs { key, .. }) => {
                    key.split(':').nth(1).unwrap_or_default().to_string()
                }
            };
            let mut local = Local::open(&args, url, &environment).await?;
            if let Command::List(list) = &args.command {
                local.tenant = list.tenant.clone();
                local.environment = list.environment.clone();
            }
            Target::Store(local)
        }
    };
    let json = args.json;
    match args.command {
        Command::List(list) => list_operations(&client, list, json).await,
        Command::Show { key } => show(&client, &key, json).await,
        Command::Approve {
            key,
            fingerprint,
            reason,
        } => {
            let body = (fingerprint.is_some() || reason.is_some()).then(|| {
                let mut body = serde_json::Map::new();
                if let Some(f) = fingerprint {
                    body.insert("fingerprint".into(), f.into());
                }
                if let Some(r) = reason {
                    body.insert("reason".into(), r.into());
                }
                Value::Object(body)
            });
            act(&client, &key, Action::Approve, body, json).await
        }
        Command::Deny { key, reason } => {
            let body = Some(json!({ "reason": reason }));
            act(&client, &key, Action::Deny, body, json).await
        }
        Command::Reconcile(r) => {
            let reason = r.reason.clone();
            let (action, mut body) = if r.applied {
                let result = match &r.result {
                    Some(text) => serde_json::from_str::<Value>(text)
                        .map_err(|e| anyhow!("--result is not JSON: {e}"))?,
                    None => Value::Null,
                };
                let reference = r.reference.unwrap_or_default();
                (
                    Action::ResolveApplied,
                    Some(json!({
                        "resolution": "applied",
                        "effect_reference": reference,
                        "result": result,
                    })),
                )
            } else if r.not_applied {
                (
                    Action::ResolveNotApplied { confirmed: r.yes },
                    Some(json!({ "resolution": "not_applied" })),
                )
            } else {
                let lookup = reason.is_some().then(|| json!({ "resolution": "lookup" }));
                (Action::Lookup, lookup)
            };
            if let (Some(Value::Object(body)), Some(reason)) = (body.as_mut(), reason) {
                body.insert("reason".into(), reason.into());
            }
            act(&client, &r.key, action, body, json).await
        }
    }
}

async fn list_operations(client: &Target, a: ListArgs, json: bool) -> anyhow::Result<ExitCode> {
    let mut query = Vec::new();
    if a.status != "all" {
        query.push(("status", a.status.clone()));
    }
    if let Some(tool) = &a.tool {
        query.push(("tool", tool.clone()));
    }
    if let Some(limit) = a.limit {
        query.push(("limit", limit.to_string()));
    }
    if let Some(after) = &a.after {
        query.push(("after", after.clone()));
    }
    let reply = client.list(&query).await?;
    if !reply.status.is_success() {
        let listing = Needs::Operator("listing operations");
        return Err(client.refusal(&reply, None, listing).await);
    }
    if json {
        println!("{}", reply.raw);
        return Ok(ExitCode::SUCCESS);
    }
    let list: OperationList =
        serde_json::from_value(reply.body).context("the list does not have the expected shape")?;
    let now = now_ms();
    let which = if a.status == "all" {
        "any status".to_string()
    } else {
        format!("status {}", a.status)
    };
    if list.operations.is_empty() {
        let queue = if a.status == "unknown" {
            " (the reconciliation queue is empty)"
        } else {
            ""
        };
        println!("no operations with {which}{queue}");
    } else {
        let mut table = table();
        table.set_header(["key", "tool", "status", "attempt", "age", "last change"]);
        for op in &list.operations {
            table.add_row([
                op.operation_key.clone(),
                op.tool.clone(),
                op.record_status.clone(),
                op.attempt.to_string(),
                ago(now, op.created_at),
                ago(now, op.updated_at),
            ]);
        }
        println!("{table}");
        let n = list.operations.len();
        println!(
            "{n} operation{} with {which}",
            if n == 1 { "" } else { "s" }
        );
    }
    if let Some(next) = &list.next_after {
        let mut again = match client {
            Target::Gateway(_) => "idemgate ops list".to_string(),
            // The URL as it may be shown: a password stays out of the terminal.
            Target::Store(local) => format!("idemgate ops --store {} list", shell_word(&local.url)),
        };
        again.push_str(&format!(" --status {}", a.status));
        for (flag, value) in [("--tenant", &a.tenant), ("--environment", &a.environment)] {
            if let Some(value) = value {
                again.push_str(&format!(" {flag} {}", shell_word(value)));
            }
        }
        if let Some(tool) = &a.tool {
            again.push_str(&format!(" --tool {}", shell_word(tool)));
        }
        if let Some(limit) = a.limit {
            again.push_str(&format!(" --limit {limit}"));
        }
        println!("more after {next}; the next page:");
        println!("  {again} --after {}", shell_word(next));
    }
    Ok(ExitCode::SUCCESS)
}

async fn show(client: &Target, key: &str, json: bool) -> anyhow::Result<ExitCode> {
    let (view, raw) = client.get_operation(key).await?;
    if json {
        println!("{raw}");
        return Ok(ExitCode::SUCCESS);
    }
    print_operation(&view, now_ms());
    Ok(ExitCode::SUCCESS)
}

fn print_operation(view: &OperationView, now: i64) {
    let r = &view.record;
    println!("operation {}", r.operation_key);
    let mut record = table();
    record.add_row(["tool", &format!("{} (version {})", r.tool, r.tool_version)]);
    record.add_row(["status", &r.record_status]);
    record.add_row(["attempt", &r.attempt.to_string()]);
    record.add_row(["fingerprint", &r.fingerprint]);
    record.add_row(["effect reference", or_none(r.effect_reference.as_deref())]);
    if let Some(job) = &r.job_id {
        record.add_row(["job", job]);
    }
    record.add_row(["approved by", or_none(r.approved_by.as_deref())]);
    record.add_row(["created", &when(now, r.created_at)]);
    record.add_row(["last change", &when(now, r.updated_at)]);
    // An unsettled record has no expiry yet: its retention counts from settlement.
    match r.expires_at {
        Some(at) if at < NEVER => record.add_row(["expires", &when(now, at)]),
        Some(_) | None => record.add_row(["expires", "not before it settles"]),
    };
    println!("{record}");
    match &view.receipt {
        Some(receipt) => println!(
            "receipt: reference {}, result {}",
            receipt.reference, receipt.result
        ),
        None => println!("receipt: none"),
    }
    println!("a caller gets now: {}", describe_outcome(&view.outcome));
    println!("timeline ({} events, oldest first):", view.events.len());
    let mut timeline = table();
    timeline.set_header(["#", "kind", "time", "attempt", "worker", "detail"]);
    for (i, e) in view.events.iter().enumerate() {
        timeline.add_row([
            (i + 1).to_string(),
            e.kind.clone(),
            timestamp(e.at),
            e.attempt.to_string(),
            e.worker.clone(),
            e.detail.clone().unwrap_or_default(),
        ]);
    }
    println!("{timeline}");
}

fn describe_outcome(o: &OutcomeView) -> String {
    let mut text = o.outcome.clone();
    if let Some(reference) = &o.effect_reference {
        text.push_str(&format!(", reference {reference}"));
    }
    text.push_str(&format!(
        "; next action {}; safe to repeat: {}",
        o.next_action,
        if o.safe_to_repeat { "yes" } else { "no" }
    ));
    if let Some(seconds) = o.retry_after_seconds {
        text.push_str(&format!("; retry after {seconds} s"));
    }
    if let Some(e) = &o.error {
        text.push_str(&format!("; {}: {}", e.code, e.message));
    }
    text
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Approve,
    Deny,
    Lookup,
    ResolveApplied,
    ResolveNotApplied { confirmed: bool },
}

impl Action {
    fn path(self) -> &'static str {
        match self {
            Action::Approve => "approve",
            Action::Deny => "deny",
            Action::Lookup | Action::ResolveApplied | Action::ResolveNotApplied { .. } => {
                "reconcile"
            }
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Action::Approve => "approving",
            Action::Deny => "denying",
            Action::Lookup => "looking the receipt up",
            Action::ResolveApplied => "resolving as applied",
            Action::ResolveNotApplied { .. } => "resolving as not applied",
        }
    }
}

/// Whether two reads of an operation show the same state: nothing was written in between.
/// The evidence that settled an operation, when its newest event is the actor `evidence`'s
/// settlement (only an `unknown` operation is ever settled that way).
fn settled_by_evidence(view: &OperationView) -> Option<String> {
    let last = view.events.last()?;
    let settled = matches!(
        view.record.record_status.as_str(),
        "applied" | "failed_permanent"
    );
    (settled && last.kind == "reconciled" && last.worker == "evidence")
        .then(|| last.detail.clone().unwrap_or_default())
}

fn unchanged(before: &OperationView, after: &OperationView) -> bool {
    before.record == after.record && before.events.len() == after.events.len()
}

async fn act(
    client: &Target,
    key: &str,
    action: Action,
    body: Option<Value>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    // Read first: a key that is missing or another tenant's is refused before anything is sent.
    let (before, before_raw) = client.get_operation(key).await?;
    // A status read of an `unknown` operation looks its receipt up too (later evidence settles
    // it, as the actor `evidence`): when that read just settled it, the lookup asked for is done.
    if action == Action::Lookup
        && let Some(settled) = settled_by_evidence(&before)
    {
        if json {
            println!("{before_raw}");
        } else {
            println!("{key}: unknown -> {}", before.record.record_status);
            if let Some(r) = &before.receipt {
                println!("  receipt: reference {}, result {}", r.reference, r.result);
            }
            println!("  settled by evidence when read: {settled}");
            println!("a caller gets now: {}", describe_outcome(&before.outcome));
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let Action::ResolveNotApplied { confirmed } = action
        && !confirmed
    {
        confirm_not_applied(&before)?;
    }
    let reply = client.post(key, action.path(), body.as_ref()).await?;
    // A denial's answer is the refusal every later delivery will get: a problem, and success.
    let denied = action == Action::Deny && reply.code() == Some("approval_denied");
    let refused = reply.problem && !denied;
    // Read again to say what changed, and, for a refusal, to prove that nothing did.
    let after = client.get_operation(key).await.map(|(v, _)| v);
    if refused {
        let changed = match &after {
            Ok(after) => !unchanged(&before, after),
            Err(_) => true,
        };
        if !changed {
            if json {
                println!("{}", reply.raw);
            }
            let needs = Needs::Operator(action.describe());
            return Err(client.refusal(&reply, Some(key), needs).await);
        }
    }
    if json {
        println!("{}", reply.raw);
    }
    let outcome: Option<OutcomeView> = serde_json::from_value(reply.body.clone()).ok();
    let after = match after {
        Ok(after) => after,
        Err(e) => {
            if !json {
                println!(
                    "{key}: the gateway answered {} ({}) but the operation could not be read \
                     again: {e:#}",
                    reply.label(),
                    outcome
                        .as_ref()
                        .map_or_else(|| reply.detail(), describe_outcome)
                );
            }
            return Ok(ExitCode::SUCCESS);
        }
    };
    let nothing = unchanged(&before, &after);
    if !json {
        print_change(key, &before, &after, outcome.as_ref());
    }
    if action == Action::Lookup && nothing {
        if !json {
            println!(
                "nothing changed: the lookup found no receipt (or could not look); the operation \
                 is still {}. Resolve it with --applied --reference REF or --not-applied once the \
                 system of record says which.",
                after.record.record_status
            );
        }
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

fn print_change(
    key: &str,
    before: &OperationView,
    after: &OperationView,
    outcome: Option<&OutcomeView>,
) {
    let b = &before.record;
    let a = &after.record;
    if b.record_status == a.record_status {
        println!("{key}: still {}", a.record_status);
    } else {
        println!("{key}: {} -> {}", b.record_status, a.record_status);
    }
    let mut changes = Vec::new();
    if b.attempt != a.attempt {
        changes.push(format!("attempt {} -> {}", b.attempt, a.attempt));
    }
    if b.effect_reference != a.effect_reference {
        changes.push(format!(
            "effect reference {} -> {}",
            or_none(b.effect_reference.as_deref()),
            or_none(a.effect_reference.as_deref())
        ));
    }
    if b.approved_by != a.approved_by {
        changes.push(format!("approved by {}", or_none(a.approved_by.as_deref())));
    }
    if before.receipt != after.receipt
        && let Some(r) = &after.receipt
    {
        changes.push(format!(
            "receipt: reference {}, result {}",
            r.reference, r.result
        ));
    }
    for change in changes {
        println!("  {change}");
    }
    if let Some(new) = after.events.get(before.events.len()..)
        && !new.is_empty()
    {
        let mut events = table();
        events.set_header(["new event", "time", "attempt", "worker", "detail"]);
        for e in new {
            events.add_row([
                e.kind.clone(),
                timestamp(e.at),
                e.attempt.to_string(),
                e.worker.clone(),
                e.detail.clone().unwrap_or_default(),
            ]);
        }
        println!("{events}");
    }
    if let Some(o) = outcome {
        println!("answer: {}", describe_outcome(o));
    }
    println!("a caller gets now: {}", describe_outcome(&after.outcome));
}

/// Asks on the terminal before the key may run again; refuses without one.
fn confirm_not_applied(before: &OperationView) -> anyhow::Result<()> {
    let key = &before.record.operation_key;
    if !std::io::stdin().is_terminal() {
        bail!(
            "resolving {key} as not applied lets its key run again; confirm with --yes \
             (standard input is not a terminal to ask on); nothing changed"
        );
    }
    let mut err = std::io::stderr();
    let _ = write!(
        err,
        "{key} is {} ({}, attempt {}).\nResolving it as not applied means the effect did NOT \
         happen, and the next delivery performs it. Checked the system of record? Type yes: ",
        before.record.record_status, before.record.tool, before.record.attempt
    );
    let _ = err.flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .context("reading the confirmation")?;
    if answer.trim() != "yes" {
        bail!("not confirmed; nothing changed");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Presentation.

/// Expiry times from here on are "never" (the store writes `i64::MAX`): year 2286 and later.
const NEVER: i64 = 10_000_000_000_000;

fn table() -> Table {
    let mut t = Table::new();
    t.load_style(presets::UTF8_FULL_CONDENSED);
    t
}

fn or_none(value: Option<&str>) -> &str {
    value.unwrap_or("-")
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// Milliseconds since the epoch as `2026-12-01 13:49:02.123 UTC`.
fn timestamp(ms: i64) -> String {
    match chrono::DateTime::from_timestamp_millis(ms) {
        Some(t) => t.format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string(),
        None => format!("{ms} ms"),
    }
}

/// An absolute time and how long ago (or ahead) it is.
fn when(now: i64, ms: i64) -> String {
    format!("{} ({})", timestamp(ms), ago(now, ms))
}

/// "3 min ago", "in 2 h", "just now".
pub(crate) fn ago(now: i64, ms: i64) -> String {
    let delta = now - ms;
    let seconds = delta.unsigned_abs() / 1000;
    let span = if seconds < 60 {
        format!("{seconds} s")
    } else if seconds < 3600 {
        format!("{} min", seconds / 60)
    } else if seconds < 86_400 {
        format!("{} h", seconds / 3600)
    } else {
        format!("{} d", seconds / 86_400)
    };
    if seconds < 1 {
        "just now".into()
    } else if delta >= 0 {
        format!("{span} ago")
    } else {
        format!("in {span}")
    }
}

/// A value as a shell word: quoted when it holds anything a shell would read specially.
fn shell_word(text: &str) -> String {
    if !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:/@=+,".contains(&b))
    {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_people_say_them() {
        let now = 10_000_000_000;
        for (ms, expect) in [
            (now, "just now"),
            (now - 12_000, "12 s ago"),
            (now - 3 * 60_000 - 5_000, "3 min ago"),
            (now - 2 * 3_600_000, "2 h ago"),
            (now - 3 * 86_400_000, "3 d ago"),
            (now + 5 * 60_000, "in 5 min"),
        ] {
            assert_eq!(ago(now, ms), expect, "{ms}");
        }
    }

    #[test]
    fn timestamps_are_utc() {
        assert_eq!(timestamp(0), "1970-01-01 00:00:00.000 UTC");
        assert_eq!(timestamp(1_764_597_000_123), "2025-12-01 13:50:00.123 UTC");
    }

    #[test]
    fn shell_words_are_quoted_when_needed() {
        assert_eq!(shell_word("acme:ci:run_1:s1"), "acme:ci:run_1:s1");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        assert_eq!(shell_word(""), "''");
    }
}
