//! `idemgate wrap -- <command> [args…]`: any stdio MCP server behind the executor.
//!
//! The host (a desktop assistant, an IDE) launches `idemgate wrap`, which starts the child,
//! lists its tools and serves them over stdio as the child lists them; every `tools/call` is
//! one delivery to the executor with the child's tool call as the effect
//! (`idemgate_downstream_mcp`). Resources, prompts, completion, subscriptions and the log
//! level pass through unchanged; the child's notifications and its requests to the host
//! (sampling, elicitation, roots) come back through the relay; when the child says its tool
//! list changed, the list is read again and served anew ([`Refresh`]).
//!
//! Each tool runs under the contract file that names it, else under defaults from its
//! annotations ([`idemgate_downstream_mcp::defaults`]): `--reads` marks reads the child did not
//! annotate, and a tool whose schema takes an idempotency key gets it filled with the
//! operation key (hidden from the model) and is resent under it after a lost answer.
//! `--list` prints how each tool is treated and exits before anything is served.
//!
//! Settings come from flags, then the configuration file (`--config`, TOML, keys below), then
//! defaults. Relative paths in the file are read from the file's directory.
//!
//! ```toml
//! store = "sqlite://wrap.sqlite"      # default: idemgate-wrap.sqlite beside this file
//! contracts = ["contracts/*.yaml"]    # optional: a contract per tool, by the tool's name
//! reads = ["search", "get_balance"]   # tools that only read (passed straight through)
//! identity = "session_window:10m"     # or "meta"
//! tenant = "local"
//! environment = "local"
//! actor = "mcp-wrap"
//! call_timeout = "60s"                # one tool call; past it the outcome is unknown
//! start_timeout = "30s"               # the child's initialize and tools/list
//! max_argument_bytes = 1048576        # one call's arguments, serialised
//! ```
//!
//! Without a configuration file the store is a SQLite file of its own per wrapped command
//! line, in the data directory (`$XDG_DATA_HOME/idemgate/wrap/`, else
//! `~/.local/share/idemgate/wrap/`): hosts start servers in a directory of their choosing
//! (often `/` or the home directory), and two different children must never share operation
//! records under one tool name.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::{Context, bail};
use idemgate_app::{Assembly, Recovery, Tool, ToolSet};
use idemgate_core::contract::Contract;
use idemgate_core::duration::Span;
use idemgate_core::key::OperationKey;
use idemgate_core::store::BoxFuture;
use idemgate_downstream_mcp::{
    Child, ChildSpec, ForwardError, McpDownstream, Started, Upstream, default_contract, defaults,
};
use idemgate_mcp::assembly::{self, IdentityRule, Local};
use idemgate_mcp::wrapped::{self, Forwarded, Host, Listing, Passthrough, Waiting, Wrap};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::stores;

/// Flags of `idemgate wrap`.
#[derive(Debug, Clone, clap::Args)]
pub struct WrapArgs {
    /// wrap's configuration file (TOML): store, contracts, identity, tenant, environment,
    /// actor, timeouts. Flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Operation store: `sqlite://PATH` or `postgres://…`. Default: beside the configuration
    /// file, or one file per wrapped command in the data directory.
    #[arg(long, value_name = "URL", env = "IDEMGATE_STORE")]
    pub store: Option<String>,
    /// How a call without `_meta` is named: `meta` or `session_window[:DURATION]`
    /// (default `session_window:10m`: the hosts that launch wrap send no `_meta`).
    #[arg(long, value_name = "RULE")]
    pub identity: Option<String>,
    /// Contract files overriding the defaults per tool (the contract's name is the tool's).
    #[arg(long, value_name = "GLOB", num_args = 1..)]
    pub contracts: Vec<String>,
    /// Tools of the child that only read, whatever their annotations say: passed straight
    /// through, no record (comma-separated, or the flag repeated).
    #[arg(long, value_name = "TOOL,…", value_delimiter = ',')]
    pub reads: Vec<String>,
    /// Print how each of the child's tools is treated (read, key-based, deduplicating on an
    /// argument idemgate fills, irreversible) and why, then exit: nothing is served or stored.
    #[arg(long)]
    pub list: bool,
    /// The tenant of every operation.
    #[arg(long, env = "IDEMGATE_TENANT")]
    pub tenant: Option<String>,
    /// The environment part of every operation key.
    #[arg(long, env = "IDEMGATE_ENVIRONMENT")]
    pub environment: Option<String>,
    /// Who is recorded as the actor of each operation.
    #[arg(long, env = "IDEMGATE_ACTOR")]
    pub actor: Option<String>,
    /// How long one tool call may take (`60s`, `5m`); past it its outcome is unknown.
    #[arg(long, value_name = "DURATION")]
    pub call_timeout: Option<String>,
    /// How long the child may take to answer `initialize` and `tools/list` (`30s`).
    #[arg(long, value_name = "DURATION")]
    pub start_timeout: Option<String>,
    /// How often the recoverer looks for due records (`2s`).
    #[arg(long, value_name = "DURATION")]
    pub recovery_interval: Option<String>,
    /// How often settled records are compacted and purged (`5m`).
    #[arg(long, value_name = "DURATION")]
    pub sweep_interval: Option<String>,
    /// The child MCP server and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// The configuration file, as written.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    store: Option<String>,
    #[serde(default)]
    contracts: Vec<String>,
    #[serde(default)]
    reads: Vec<String>,
    identity: Option<String>,
    tenant: Option<String>,
    environment: Option<String>,
    actor: Option<String>,
    call_timeout: Option<String>,
    start_timeout: Option<String>,
    recovery_interval: Option<String>,
    sweep_interval: Option<String>,
    max_argument_bytes: Option<usize>,
}

/// Everything settled: flags over file over defaults.
#[derive(Debug)]
struct Settings {
    store: String,
    contracts: Vec<String>,
    reads: BTreeSet<String>,
    list: bool,
    identity: IdentityRule,
    local: Local,
    call_timeout: Duration,
    start_timeout: Duration,
    max_argument_bytes: usize,
    recovery: Recovery,
    spec: ChildSpec,
}

fn duration(what: &str, text: &str) -> anyhow::Result<Duration> {
    let span = Span::parse(text).map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
    if span.seconds() == 0 {
        bail!("{what}: must be longer than zero");
    }
    Ok(span.as_duration())
}

/// A path from the configuration file, read from the file's directory when relative.
fn beside(base: &Path, path: &str) -> String {
    if Path::new(path).is_absolute() {
        path.to_string()
    } else {
        base.join(path).display().to_string()
    }
}

/// The store URL with a relative SQLite path resolved against `base`.
fn store_beside(base: &Path, url: &str) -> String {
    match url.strip_prefix("sqlite://") {
        Some(path) if !path.is_empty() => format!("sqlite://{}", beside(base, path)),
        _ => url.to_string(),
    }
}

/// The SQLite file of one wrapped command line, in the data directory.
fn default_store(command: &[String]) -> anyhow::Result<String> {
    let data = std::env::var_os("XDG_DATA_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")));
    let Some(data) = data else {
        bail!("neither XDG_DATA_HOME nor HOME is set: give the store with --store or --config");
    };
    let dir = data.join("idemgate").join("wrap");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut hash = Sha256::new();
    for part in command {
        hash.update(part.as_bytes());
        hash.update([0]);
    }
    let digest = hash.finalize();
    let short: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    let program = Path::new(&command[0])
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let slug: String = program
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(40)
        .collect();
    Ok(format!("sqlite://{}/{slug}-{short}.sqlite", dir.display()))
}

fn settle(args: WrapArgs) -> anyhow::Result<Settings> {
    let (file, base) = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let file: FileConfig =
                toml::from_str(&text).with_context(|| format!("{}", path.display()))?;
            let base = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .map(Path::to_path_buf)
                .unwrap_or_else(|| PathBuf::from("."));
            (file, Some(base))
        }
        None => (FileConfig::default(), None),
    };
    let store = match (&args.store, &file.store, &base) {
        (Some(url), _, _) => url.clone(),
        (None, Some(url), Some(base)) => store_beside(base, url),
        (None, _, Some(base)) => format!("sqlite://{}", beside(base, "idemgate-wrap.sqlite")),
        // `--list` opens no store: nothing is made in the data directory either.
        (None, _, None) if args.list => String::new(),
        (None, _, None) => default_store(&args.command)?,
    };
    let contracts = if !args.contracts.is_empty() {
        args.contracts.clone()
    } else {
        let base = base.clone().unwrap_or_else(|| PathBuf::from("."));
        file.contracts.iter().map(|c| beside(&base, c)).collect()
    };
    let reads: BTreeSet<String> = if args.reads.is_empty() {
        file.reads.iter().cloned().collect()
    } else {
        args.reads.iter().map(|r| r.trim().to_string()).collect()
    };
    let identity = match args.identity.as_deref().or(file.identity.as_deref()) {
        Some(text) => text
            .parse()
            .map_err(|e| anyhow::anyhow!("--identity: {e}"))?,
        None => IdentityRule::SessionWindow(IdentityRule::DEFAULT_WINDOW),
    };
    // A duration from the flag, else the file, else the default.
    let span =
        |what: &str, flag: &Option<String>, file: &Option<String>, default: Duration| match flag
            .as_deref()
            .or(file.as_deref())
        {
            Some(t) => duration(what, t),
            None => Ok(default),
        };
    let call_timeout = span(
        "call_timeout",
        &args.call_timeout,
        &file.call_timeout,
        Duration::from_secs(60),
    )?;
    let start_timeout = span(
        "start_timeout",
        &args.start_timeout,
        &file.start_timeout,
        Duration::from_secs(30),
    )?;
    let defaults = Recovery::default();
    let recovery = Recovery {
        every: span(
            "recovery_interval",
            &args.recovery_interval,
            &file.recovery_interval,
            defaults.every,
        )?,
        sweep_every: span(
            "sweep_interval",
            &args.sweep_interval,
            &file.sweep_interval,
            defaults.sweep_every,
        )?,
    };
    let pick = |flag: &Option<String>, file: &Option<String>, default: &str| {
        flag.clone()
            .or_else(|| file.clone())
            .unwrap_or_else(|| default.to_string())
    };
    let local = Local {
        tenant: pick(&args.tenant, &file.tenant, "local"),
        environment: pick(&args.environment, &file.environment, "local"),
        actor: pick(&args.actor, &file.actor, "mcp-wrap"),
        identity,
    };
    let mut spec = ChildSpec::new(args.command[0].clone(), args.command[1..].to_vec());
    spec.call_timeout = call_timeout;
    spec.start_timeout = start_timeout;
    Ok(Settings {
        store,
        contracts,
        reads,
        list: args.list,
        identity,
        local,
        call_timeout,
        start_timeout,
        max_argument_bytes: file
            .max_argument_bytes
            .unwrap_or(idemgate_downstream_mcp::DEFAULT_MAX_ARGUMENT_BYTES),
        recovery,
        spec,
    })
}

/// The child as the MCP face's pass-through.
struct ChildPassthrough {
    child: Arc<Child>,
    started: Started,
    /// The host, once it connected.
    host: OnceLock<Arc<dyn Host>>,
}

/// A JSON-RPC error of the child, for the host.
fn to_host(e: ForwardError) -> Forwarded {
    let ForwardError {
        code,
        message,
        data,
    } = e;
    Forwarded {
        code,
        message,
        data,
    }
}

/// A JSON-RPC error of the host, for the child.
fn to_child(e: Forwarded) -> ForwardError {
    let Forwarded {
        code,
        message,
        data,
    } = e;
    ForwardError {
        code,
        message,
        data,
    }
}

/// The MCP face's host as the child's relay sees it.
struct ToHost(Arc<dyn Host>);

impl Upstream for ToHost {
    fn notify(&self, method: &str, params: Value) {
        self.0.notify(method, params);
    }

    fn request<'a>(
        &'a self,
        method: &'a str,
        params: Value,
    ) -> BoxFuture<'a, Result<Value, ForwardError>> {
        Box::pin(async move { self.0.request(method, params).await.map_err(to_child) })
    }
}

impl Passthrough for ChildPassthrough {
    fn attach(&self, host: Arc<dyn Host>) {
        if self.host.set(host.clone()).is_ok() {
            self.child.relay().attach(Arc::new(ToHost(host)));
        }
    }

    fn expect_progress(
        &self,
        tool: &str,
        arguments: &Value,
        operation: Option<&OperationKey>,
        token: Option<Value>,
    ) -> Waiting {
        let operation = operation.map(OperationKey::as_str);
        Box::new(self.child.relay().expect(tool, arguments, operation, token))
    }

    fn notify<'a>(&'a self, method: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(self.child.notify(method))
    }

    fn capabilities(&self) -> Value {
        self.started.capabilities.clone()
    }

    fn instructions(&self) -> Option<String> {
        self.started.instructions.clone()
    }

    fn forward<'a>(
        &'a self,
        method: &'a str,
        params: Value,
    ) -> BoxFuture<'a, Result<Value, Forwarded>> {
        Box::pin(async move { self.child.forward(method, params).await.map_err(to_host) })
    }
}

/// How each listed tool is served: the contract file's where one names it, else the defaults
/// from its annotations and wrap's `--reads` (with one warning on stderr per tool, the first
/// time).
struct Contracts {
    child: String,
    files: Vec<Arc<Contract>>,
    /// The tools the operator marked as reads.
    reads: BTreeSet<String>,
    lease_seconds: u64,
    warned: Mutex<BTreeSet<String>>,
}

/// One tool as it is served.
struct Treated {
    contract: Arc<Contract>,
    /// The argument filled with the operation key, hidden from the model.
    key_argument: Option<String>,
    /// How it is treated and why, in one clause.
    how: String,
}

impl Contracts {
    /// A contract or a `--reads` naming no listed tool is an error at start: it would silently
    /// protect nothing. (After a change of the child's list it is not: the tool may come back.)
    fn check_files(&self, tools: &[Map<String, Value>]) -> anyhow::Result<()> {
        let names: Vec<&str> = tools
            .iter()
            .filter_map(|t| t.get("name").and_then(Value::as_str))
            .collect();
        if let Some(stray) = self
            .files
            .iter()
            .find(|c| !names.contains(&c.name.as_str()))
        {
            bail!(
                "contract `{}` names no tool of the child `{}` (it lists: {})",
                stray.name,
                self.child,
                names.join(", ")
            );
        }
        if let Some(stray) = self.reads.iter().find(|r| !names.contains(&r.as_str())) {
            bail!(
                "--reads names `{stray}`, which is no tool of the child `{}` (it lists: {})",
                self.child,
                names.join(", ")
            );
        }
        if let Some(both) = self.files.iter().find(|c| self.reads.contains(&c.name)) {
            bail!(
                "tool `{}` is named by --reads and by a contract file; say its class in one place (the contract's effect_class)",
                both.name
            );
        }
        Ok(())
    }

    fn of(&self, tool: &Map<String, Value>) -> Result<Treated, String> {
        let name = tool.get("name").and_then(Value::as_str).unwrap_or_default();
        if let Some(contract) = self.files.iter().find(|c| c.name == name) {
            let key_argument = defaults::key_argument(tool).filter(|_| contract.requires_key());
            let how = format!(
                "{} (contract file, version {}){}",
                contract.effect_class.as_str(),
                contract.version,
                key_argument
                    .as_deref()
                    .map(|a| format!(
                        ": `{a}` is filled with the operation key and hidden from the model{}",
                        if contract.deduplicates() {
                            ", a lost answer is resent under the same key"
                        } else {
                            ""
                        }
                    ))
                    .unwrap_or_default()
            );
            return Ok(Treated {
                contract: contract.clone(),
                key_argument,
                how,
            });
        }
        let read = self.reads.contains(name);
        let contract = default_contract(tool, self.lease_seconds, read).map_err(|e| {
            format!(
                "tool `{name}` of the child `{}` cannot run under default contracts: {}{}",
                self.child,
                e.field
                    .as_deref()
                    .map(|f| format!("{f}: "))
                    .unwrap_or_default(),
                e.message
            )
        })?;
        let key_argument = defaults::key_argument(tool).filter(|_| contract.requires_key());
        Ok(Treated {
            how: defaults::treatment(tool, &contract, read),
            contract,
            key_argument,
        })
    }

    /// [`Contracts::of`], with the warning on stderr the first time a tool runs under defaults.
    fn serve(&self, tool: &Map<String, Value>) -> Result<Treated, String> {
        let treated = self.of(tool)?;
        let name = tool.get("name").and_then(Value::as_str).unwrap_or_default();
        let defaulted = !self.files.iter().any(|c| c.name == name);
        let first = defaulted
            && self
                .warned
                .lock()
                .map(|mut w| w.insert(name.to_string()))
                .unwrap_or(true);
        if first {
            eprintln!(
                "{}",
                defaults::warning(
                    &self.child,
                    tool,
                    &treated.contract,
                    self.reads.contains(name)
                )
            );
        }
        Ok(treated)
    }
}

/// Serves the child's tool list again when it changed: the same contracts and defaults as at
/// start; each tool's contract is served by the app's registry before the tool is listed; then the
/// host is told its list changed. A tool that left the list is refused by name; a name that
/// now collides (with idemgate's own tool, or twice in the list) is left out, refused with the
/// error it would have stopped the start with, and printed on stderr.
struct Refresh {
    child: Arc<Child>,
    passthrough: Arc<ChildPassthrough>,
    tools: Arc<ToolSet>,
    listing: Arc<Listing>,
    contracts: Arc<Contracts>,
    max_argument_bytes: usize,
}

impl Refresh {
    fn serve(&self, tool: &Map<String, Value>) -> Result<Map<String, Value>, String> {
        let treated = self.contracts.serve(tool)?;
        let downstream = McpDownstream::new(self.child.clone(), treated.contract.name.clone())
            .with_max_argument_bytes(self.max_argument_bytes)
            .with_key_argument(treated.key_argument.clone());
        self.tools.serve(Tool {
            contract: treated.contract.clone(),
            downstream: Arc::new(downstream),
            authorizer: None,
        });
        Ok(wrapped::listed(
            tool,
            &treated.contract,
            treated.key_argument.as_deref(),
        ))
    }

    async fn once(&self) {
        let shown = self.contracts.child.clone();
        let tools = match self.child.list_tools().await {
            Ok(tools) => tools,
            Err(e) => {
                tracing::warn!(child = %shown, error = %e, "the changed tool list could not be read; serving the previous one");
                return;
            }
        };
        let mut refused = BTreeMap::new();
        for e in wrapped::refused_names(&shown, &tools) {
            eprintln!("idemgate wrap: error: {e}; the tool is not served");
            if let Some(tool) = e.tool() {
                refused.insert(tool.to_string(), e.to_string());
            }
        }
        let mut listed = Vec::new();
        for tool in &tools {
            let Some(name) = tool.get("name").and_then(Value::as_str) else {
                continue;
            };
            if refused.contains_key(name) {
                continue;
            }
            match self.serve(tool) {
                Ok(tool) => listed.push(tool),
                Err(message) => {
                    eprintln!("idemgate wrap: error: {message}; the tool is not served");
                    refused.insert(name.to_string(), message);
                }
            }
        }
        tracing::info!(child = %shown, tools = listed.len(), "the child's tool list changed");
        self.listing.replace(listed, refused, |tool| {
            format!(
                "tool `{tool}` is no longer offered by the child `{shown}`: it left the child's tool list; nothing was sent"
            )
        });
        if let Some(host) = self.passthrough.host.get() {
            host.notify("notifications/tools/list_changed", json!({}));
        }
    }

    /// Until the child is shut down: one refresh per change (changes that come while one
    /// runs are taken up by the next).
    async fn run(self) {
        let mut changes = self.child.relay().watch_tools();
        changes.borrow_and_update();
        while changes.changed().await.is_ok() {
            changes.borrow_and_update();
            self.once().await;
        }
    }
}

/// Runs `idemgate wrap` until the host closes stdin, or Ctrl-C / SIGTERM.
pub async fn run(args: WrapArgs) -> anyhow::Result<()> {
    let settings = settle(args)?;
    let files = if settings.contracts.is_empty() {
        Vec::new()
    } else {
        idemgate_app::contracts::load(&settings.contracts, Path::new(""))?
            .into_iter()
            .map(Arc::new)
            .collect()
    };
    let shown = settings.spec.display();
    let (child, started) = Child::start(settings.spec.clone()).await?;
    let result = serve(&settings, files, child.clone(), started).await;
    child.shutdown().await;
    result.with_context(|| format!("wrapping `{shown}`"))
}

/// `wrap --list`: one line per tool of the child, `NAME  CLASS  how and why`, names aligned.
fn print_list(
    child: &str,
    contracts: &Contracts,
    tools: &[Map<String, Value>],
) -> anyhow::Result<()> {
    use std::io::Write;
    let mut rows = Vec::new();
    for tool in tools {
        let name = defaults::tool_name(tool).unwrap_or_default().to_string();
        let treated = contracts.of(tool).map_err(anyhow::Error::msg)?;
        rows.push((name, treated.how));
    }
    let width = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    let mut out = std::io::stdout().lock();
    let noun = if rows.len() == 1 { "tool" } else { "tools" };
    writeln!(out, "{child}: {} {noun}", rows.len())?;
    for (name, how) in rows {
        writeln!(out, "  {name:width$}  {how}")?;
    }
    out.flush()?;
    Ok(())
}

async fn serve(
    settings: &Settings,
    files: Vec<Arc<Contract>>,
    child: Arc<Child>,
    started: Started,
) -> anyhow::Result<()> {
    let shown = settings.spec.display();
    wrapped::check_names(&shown, &started.tools)?;
    // The executor renews the lease at a third of its length while a call runs, so it need
    // not outlast the call; it bounds how soon a wrap that died mid-call is recovered.
    let lease = settings.call_timeout.as_secs().clamp(10, 600);
    let contracts = Arc::new(Contracts {
        child: shown.clone(),
        files,
        reads: settings.reads.clone(),
        lease_seconds: lease,
        warned: Mutex::new(BTreeSet::new()),
    });
    contracts.check_files(&started.tools)?;
    if settings.list {
        return print_list(&shown, &contracts, &started.tools);
    }
    let mut tools = Vec::new();
    let mut listed = Vec::new();
    for tool in &started.tools {
        let treated = contracts.serve(tool).map_err(anyhow::Error::msg)?;
        let downstream = McpDownstream::new(child.clone(), treated.contract.name.clone())
            .with_max_argument_bytes(settings.max_argument_bytes)
            .with_key_argument(treated.key_argument.clone());
        tools.push(Tool {
            contract: treated.contract.clone(),
            downstream: Arc::new(downstream),
            authorizer: None,
        });
        listed.push(wrapped::listed(
            tool,
            &treated.contract,
            treated.key_argument.as_deref(),
        ));
    }
    let store = stores::open(&settings.store).await?;
    tracing::info!(
        child = %shown,
        tools = tools.len(),
        store = %settings.store,
        start_timeout_seconds = settings.start_timeout.as_secs(),
        "wrapping a child MCP server over stdio"
    );
    settings.local.check()?;
    // No authorization hooks: every tool is allowed without asking.
    let app = Assembly::new(
        store,
        ToolSet::from_tools(tools)?,
        settings.local.environment.clone(),
    )
    .recovery(settings.recovery)
    .build();
    let passthrough = Arc::new(ChildPassthrough {
        child: child.clone(),
        started,
        host: OnceLock::new(),
    });
    let listing = Arc::new(Listing::new(listed));
    let refresh = Refresh {
        child,
        passthrough: passthrough.clone(),
        tools: app.tools().clone(),
        listing: listing.clone(),
        contracts,
        max_argument_bytes: settings.max_argument_bytes,
    };
    let refreshing = tokio::spawn(refresh.run());
    let options = idemgate_mcp::Options {
        wrap: Some(Wrap {
            child: passthrough,
            listing,
        }),
        identity: settings.identity,
        ..Default::default()
    };
    let served = assembly::serve_stdio(
        &app,
        Arc::new(app.clone()),
        settings.local.caller(),
        options,
        crate::signals::shutdown(),
    )
    .await;
    refreshing.abort();
    served?;
    Ok(())
}
