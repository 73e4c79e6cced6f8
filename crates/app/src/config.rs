//! The configuration file every face reads (`idemgate serve --config`, `idemgate mcp
//! --config`, `idemgate consume --config`, `idemgate audit export --config`), and the step from
//! it to the application.
//!
//! One TOML file, in layers. This module owns the file's layout and the application's part of
//! it ([`Config`]: the store, the environment, the contracts, the sandbox, recovery, the
//! executor's settings, the encryption key, the tenants' names). A face reads its own sections
//! from the same text with [`File::section`] — the HTTP gateway its listen address, public URL,
//! limits, tokens and webhook sources; the MCP face its `[mcp]` table — into a model of its own,
//! so no face needs another face to read the file.
//!
//! Reading is strict: a key the layout does not know is an error (the faces' keys included in
//! the list it names), and every error names the file, the line, the column where there is one,
//! and the field, so a typo never silently becomes a default.
//!
//! [`File::contracts`], [`File::tools`] and [`File::assembly`] go from the file to an
//! [`Assembly`]: the contracts (or the embedded examples for the development set-up, from any
//! directory), each tool's effect (its `downstream.http`, or the sandbox), and the gateway's
//! store with its audit key and encryption at rest.

use std::path::{Path, PathBuf};
use std::time::Duration;

use idemgate_core::contract::{Contract, LoadError};
use idemgate_engine::Settings;
use serde::Deserialize;
use serde::de::{DeserializeOwned, IgnoredAny};

use crate::assembly::{Assembly, Recovery};
use crate::contracts;
use crate::tools::{Effects, HttpEffects, SandboxEffects, ToolSet};

/// The embedded store of a set-up without configuration, in the working directory.
pub const DEFAULT_STORE: &str = "sqlite://idemgate.sqlite";
/// Where the example contracts live in a checkout.
pub const DEFAULT_CONTRACTS: &str = "contracts/*.yaml";
/// The environment part of every operation key unless configured.
pub const DEFAULT_ENVIRONMENT: &str = "development";

/// A configuration that could not be read or accepted: the same file, line, column and field
/// report as a contract's.
pub type Error = LoadError;

/// The application's part of the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The environment part of every operation key (`tenant:environment:workflow:step`).
    pub environment: String,
    /// `sqlite://PATH` or `postgres://…`.
    pub store: String,
    /// Contract files or globs (`*` within the file name). Relative paths are read from the
    /// directory of the configuration file.
    pub contracts: Vec<String>,
    /// Perform every tool's effect against the in-process sandbox instead of its declared
    /// downstream. For trying idemgate out; effects are not real.
    pub sandbox: bool,
    /// The environment variable that holds the key for encrypting stored requests and results
    /// at rest; a set-up whose key cannot be read refuses to start.
    pub encryption_key_env: Option<String>,
    pub recovery: RecoveryConfig,
    pub executor: ExecutorConfig,
    /// The longest `workflow_id` or `step_id` a caller may name, in bytes, whichever face
    /// carries the call (`[limits] key_part_bytes`; the rest of `[limits]` is the HTTP face's).
    pub key_part_bytes: usize,
    /// The tenants' names, in the order written: the tenant part of every operation key their
    /// callers make. Their credentials belong to the face that authenticates them.
    pub tenants: Vec<String>,
}

/// How often the background recoverer and the retention sweeper run (`[recovery]`).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct RecoveryConfig {
    pub interval_seconds: u64,
    pub sweep_interval_seconds: u64,
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        RecoveryConfig {
            interval_seconds: 5,
            sweep_interval_seconds: 300,
        }
    }
}

impl RecoveryConfig {
    /// The intervals as the assembly takes them.
    pub fn intervals(self) -> Recovery {
        Recovery {
            every: Duration::from_secs(self.interval_seconds),
            sweep_every: Duration::from_secs(self.sweep_interval_seconds),
        }
    }
}

/// The executor's tunables (`[executor]`).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ExecutorConfig {
    /// Settled records kept in memory so that their replays read no row (0: none).
    pub settled_records: usize,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        ExecutorConfig {
            settled_records: Settings::default().settled_records,
        }
    }
}

impl ExecutorConfig {
    pub fn settings(self) -> Settings {
        Settings {
            settled_records: self.settled_records,
            ..Settings::default()
        }
    }
}

/// The whole file's layout: the application's keys, and the faces' keys, which this layer
/// takes without reading them. Their order is the order an unknown key's message lists them.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Layout {
    #[serde(default)]
    #[allow(dead_code)]
    listen: IgnoredAny,
    #[serde(default)]
    #[allow(dead_code)]
    public_url: IgnoredAny,
    #[serde(default = "default_environment")]
    environment: String,
    #[serde(default = "default_store")]
    store: String,
    #[serde(default = "default_contracts")]
    contracts: Vec<String>,
    #[serde(default)]
    sandbox: bool,
    #[serde(default)]
    encryption_key_env: Option<String>,
    #[serde(default)]
    limits: KeyLimits,
    #[serde(default)]
    recovery: RecoveryConfig,
    #[serde(default)]
    executor: ExecutorConfig,
    #[serde(default)]
    #[allow(dead_code)]
    mcp: IgnoredAny,
    #[serde(default)]
    tenants: Vec<Tenant>,
    #[serde(default)]
    #[allow(dead_code)]
    webhooks: IgnoredAny,
}

/// `[limits]` as this layer reads it: the bound on key parts. The other bounds are the HTTP
/// face's, which reads the table strictly.
#[derive(Deserialize)]
#[serde(default)]
struct KeyLimits {
    key_part_bytes: usize,
}

impl Default for KeyLimits {
    fn default() -> Self {
        KeyLimits {
            key_part_bytes: crate::assembly::DEFAULT_KEY_PART_BYTES,
        }
    }
}

/// A `[[tenants]]` entry as this layer reads it: the name; its tokens are the HTTP face's.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Tenant {
    name: String,
    #[serde(default)]
    #[allow(dead_code)]
    tokens: IgnoredAny,
}

fn default_environment() -> String {
    DEFAULT_ENVIRONMENT.into()
}
fn default_store() -> String {
    DEFAULT_STORE.into()
}
fn default_contracts() -> Vec<String> {
    vec![DEFAULT_CONTRACTS.into()]
}

impl Config {
    /// The development defaults: embedded SQLite in the working directory, the example
    /// contracts, the sandbox, no tenants.
    pub fn development() -> Config {
        Config {
            environment: default_environment(),
            store: default_store(),
            contracts: default_contracts(),
            sandbox: true,
            encryption_key_env: None,
            recovery: RecoveryConfig::default(),
            executor: ExecutorConfig::default(),
            key_part_bytes: crate::assembly::DEFAULT_KEY_PART_BYTES,
            tenants: Vec::new(),
        }
    }
}

/// A configuration file as read: its text (which the faces read their sections from), the
/// application's part, and where relative paths in it are read from.
#[derive(Debug, Clone)]
pub struct File {
    /// The file as named in errors.
    pub name: String,
    text: String,
    /// The directory relative contract paths are read from.
    pub base: PathBuf,
    /// Whether this is the no-configuration development set-up.
    pub development: bool,
    pub config: Config,
}

impl File {
    /// Reads and checks a configuration file.
    pub fn load(path: &Path) -> Result<File, Error> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| Error {
            file: name.clone(),
            line: None,
            column: None,
            field: None,
            message: format!("cannot be read: {e}"),
        })?;
        let base = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let mut file = File::parse(text, &name)?;
        file.base = base;
        Ok(file)
    }

    /// Parses TOML text; `name` names it in errors. Relative paths are read from the working
    /// directory.
    pub fn parse(text: impl Into<String>, name: &str) -> Result<File, Error> {
        let text = text.into();
        let layout: Layout = from_toml(&text, name)?;
        let config = Config {
            environment: layout.environment,
            store: layout.store,
            contracts: layout.contracts,
            sandbox: layout.sandbox,
            encryption_key_env: layout.encryption_key_env,
            recovery: layout.recovery,
            executor: layout.executor,
            key_part_bytes: layout.limits.key_part_bytes,
            tenants: layout.tenants.into_iter().map(|t| t.name).collect(),
        };
        let file = File {
            name: name.to_string(),
            text,
            base: PathBuf::from("."),
            development: false,
            config,
        };
        file.check()?;
        Ok(file)
    }

    /// The development set-up: no file, [`Config::development`].
    pub fn development() -> File {
        File {
            name: "(development defaults)".into(),
            text: String::new(),
            base: PathBuf::from("."),
            development: true,
            config: Config::development(),
        }
    }

    /// A set-up made of values rather than a file (a command's flags): `config`, read from the
    /// working directory.
    pub fn from_config(config: Config) -> File {
        File {
            name: "(command line)".into(),
            text: String::new(),
            base: PathBuf::from("."),
            development: false,
            config,
        }
    }

    /// A face's sections, read from the same text into the face's own model: `T` names the
    /// top-level keys it reads as fields (without `deny_unknown_fields`: the layout has
    /// already refused keys nobody knows; its nested tables should deny theirs). Errors are
    /// located as the layout's are.
    pub fn section<T: DeserializeOwned>(&self) -> Result<T, Error> {
        from_toml(&self.text, &self.name)
    }

    /// An error about `field`, located at the first line that sets it: for a face's own
    /// checks of its sections.
    pub fn error(&self, field: &str, message: impl Into<String>) -> Error {
        Error {
            file: self.name.clone(),
            line: line_of(&self.text, field),
            column: None,
            field: Some(field.to_string()),
            message: message.into(),
        }
    }

    fn check(&self) -> Result<(), Error> {
        let config = &self.config;
        if !key_part(&config.environment) {
            return Err(self.error(
                "environment",
                "must be printable ASCII without spaces or `:` (it is part of every operation key)",
            ));
        }
        if config.contracts.is_empty() {
            return Err(self.error("contracts", "name at least one contract file or glob"));
        }
        if config.recovery.interval_seconds == 0 || config.recovery.sweep_interval_seconds == 0 {
            return Err(self.error("recovery", "intervals must be at least one second"));
        }
        if config.key_part_bytes == 0 {
            return Err(self.error("limits", "key_part_bytes must be at least 1"));
        }
        if let Some(name) = config.tenants.iter().find(|name| !key_part(name)) {
            return Err(self.error(
                "name",
                format!(
                    "tenant name `{}` must be printable ASCII without spaces or `:`",
                    name.escape_default()
                ),
            ));
        }
        Ok(())
    }
}

/// A value that may be a part of an operation key.
pub fn key_part(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b':')
}

/// Deserializes TOML text, locating an error by line, column and field.
fn from_toml<T: DeserializeOwned>(text: &str, file: &str) -> Result<T, Error> {
    toml::from_str(text).map_err(|e| {
        let (line, column) = match e.span() {
            Some(span) => {
                let (l, c) = line_column(text, span.start);
                (Some(l), Some(c))
            }
            None => (None, None),
        };
        let message = e.message().trim().to_string();
        // toml names an unknown field in the message; a bad value is located by its span.
        let field = message
            .strip_prefix("unknown field `")
            .and_then(|rest| rest.split('`').next())
            .map(str::to_string)
            .or_else(|| e.span().and_then(|s| key_before(text, s.start)));
        Error {
            file: file.to_string(),
            line,
            column,
            field,
            message,
        }
    })
}

/// One-based line and column of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rfind('\n')
        .map_or(before.len(), |n| before.len() - n - 1)
        + 1;
    (line, column)
}

/// The key on the line of `offset`, when the line reads `key = value`.
fn key_before(text: &str, offset: usize) -> Option<String> {
    let start = text[..offset.min(text.len())]
        .rfind('\n')
        .map_or(0, |n| n + 1);
    let line = text[start..].lines().next()?;
    let (key, _) = line.split_once('=')?;
    let key = key.trim();
    (!key.is_empty() && !key.starts_with('[')).then(|| key.to_string())
}

/// The first line where `field` is written as a key.
fn line_of(text: &str, field: &str) -> Option<usize> {
    text.lines()
        .position(|l| {
            let t = l.trim_start();
            t.starts_with(field) && t[field.len()..].trim_start().starts_with('=')
                || t == format!("[{field}]")
        })
        .map(|i| i + 1)
}

/// Why a configuration could not become an application.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AssemblyError {
    #[error(transparent)]
    Config(#[from] Error),
    #[error("contracts: {0}")]
    Contracts(String),
    #[error("store {url}: {message}")]
    Store { url: String, message: String },
    /// A setting that cannot be honoured (an encryption key that cannot be read): the start is
    /// refused rather than run otherwise than configured.
    #[error("{0}")]
    Unsupported(String),
}

/// A store that could not be opened: a bad URL or store is `Store`, a bad audit or encryption
/// key `Unsupported`.
impl From<crate::GatewayStoreError> for AssemblyError {
    fn from(e: crate::GatewayStoreError) -> AssemblyError {
        match e {
            crate::GatewayStoreError::Open(e) => AssemblyError::Store {
                url: e.url,
                message: e.message,
            },
            other => AssemblyError::Unsupported(other.to_string()),
        }
    }
}

impl File {
    /// Checks what can only be judged at start: the encryption key must be readable, or the
    /// start is refused rather than store results unencrypted.
    pub fn check_supported(&self) -> Result<(), AssemblyError> {
        if let Some(var) = &self.config.encryption_key_env {
            crate::encryption_key(var)?;
        }
        Ok(())
    }

    /// The contracts the configuration names, loaded and checked. The development set-up
    /// without contract files where it runs takes the embedded examples, so that it runs from
    /// any directory.
    pub fn contracts(&self) -> Result<Vec<Contract>, AssemblyError> {
        let config = &self.config;
        let files = match contracts::files(&config.contracts, &self.base) {
            Ok(files) => files,
            // No `contracts/` directory here: the development set-up still starts.
            Err(_) if self.development => Vec::new(),
            Err(e) => {
                return Err(AssemblyError::Contracts(format!(
                    "contract pattern `{}`: {}",
                    e.pattern, e.message
                )));
            }
        };
        if files.is_empty() && self.development {
            eprintln!("idemgate: no contracts/*.yaml here; using the embedded example contracts");
            contracts::examples().map_err(|e| AssemblyError::Contracts(e.to_string()))
        } else if files.is_empty() {
            Err(AssemblyError::Contracts(format!(
                "no contract file matches {:?}",
                config.contracts
            )))
        } else {
            contracts::load_files(&files).map_err(|e| {
                AssemblyError::Contracts(match e {
                    contracts::Error::Read { path, source } => {
                        format!("{path}: cannot be read: {source}")
                    }
                    other => other.to_string(),
                })
            })
        }
    }

    /// How tools perform their effects: the sandbox, or each contract's downstream.
    pub fn effects(&self) -> Box<dyn Effects> {
        if self.config.sandbox {
            Box::new(SandboxEffects)
        } else {
            Box::new(HttpEffects)
        }
    }

    /// The configured contracts, each with its effect ([`File::effects`]).
    pub fn tools(&self) -> Result<ToolSet, AssemblyError> {
        ToolSet::build(self.contracts()?, self.effects().as_ref())
            .map_err(|e| AssemblyError::Contracts(e.to_string()))
    }

    /// Opens the configured store (audit entries signed with `IDEMGATE_AUDIT_KEY`, requests and
    /// results sealed at rest when a key is configured) and assembles it with `tools`, the
    /// environment, the executor's settings and the recovery intervals. A face adds what it
    /// needs (metrics, a clock) and builds the [`crate::App`].
    pub async fn assembly(&self, tools: ToolSet) -> Result<Assembly, AssemblyError> {
        self.check_supported()?;
        let config = &self.config;
        let store =
            crate::open_gateway_store(&config.store, config.encryption_key_env.as_deref()).await?;
        Ok(Assembly::new(store, tools, config.environment.clone())
            .settings(config.executor.settings())
            .recovery(config.recovery.intervals())
            .key_part_bytes(config.key_part_bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, expect: Result<(), &str>) {
        match (File::parse(text, "gate.toml"), expect) {
            (Ok(_), Ok(())) => {}
            (Err(e), Err(shown)) => assert_eq!(e.to_string(), shown),
            (got, expect) => panic!("{text}: got {got:?}, expected {expect:?}"),
        }
    }

    #[test]
    fn the_applications_part() {
        check("", Ok(()));
        // The faces' sections are taken without being read here.
        check(
            "listen = \"127.0.0.1:0\"\n[limits]\nbody_bytes = 1\n[mcp]\nx = 1\n[webhooks.a]\ny = 2\n",
            Ok(()),
        );
        check(
            "listen = \"127.0.0.1:0\"\nlisten_on = 1\n",
            Err(
                "gate.toml:2:1: field `listen_on`: unknown field `listen_on`, expected one of `listen`, `public_url`, `environment`, `store`, `contracts`, `sandbox`, `encryption_key_env`, `limits`, `recovery`, `executor`, `mcp`, `tenants`, `webhooks`",
            ),
        );
        check(
            "environment = \"a:b\"\n",
            Err(
                "gate.toml:1: field `environment`: must be printable ASCII without spaces or `:` (it is part of every operation key)",
            ),
        );
        check("[executor]\nsettled_records = 0\n", Ok(()));
        check(
            "[executor]\nsettled_records = -1\n",
            Err(
                "gate.toml:2:19: field `settled_records`: invalid value: integer `-1`, expected usize",
            ),
        );
        check(
            "[[tenants]]\nname = \"a b\"\n",
            Err(
                "gate.toml:2: field `name`: tenant name `a b` must be printable ASCII without spaces or `:`",
            ),
        );
        check(
            "[[tenants]]\nnmae = \"a\"\n",
            Err("gate.toml:2:1: field `nmae`: unknown field `nmae`, expected `name` or `tokens`"),
        );
        check(
            "[recovery]\ninterval_seconds = 0\n",
            Err("gate.toml:1: field `recovery`: intervals must be at least one second"),
        );
        let file = File::parse(
            "environment = \"prod\"\nstore = \"sqlite://x.db\"\n[[tenants]]\nname = \"acme\"\n[[tenants.tokens]]\nname = \"t\"\n",
            "gate.toml",
        )
        .unwrap();
        assert_eq!(file.config.environment, "prod");
        assert_eq!(file.config.tenants, ["acme"]);
    }

    #[test]
    fn a_face_reads_its_sections_from_the_same_text() {
        #[derive(Deserialize, Default)]
        #[serde(default)]
        struct Face {
            listen: Option<String>,
            limits: Limits,
        }
        #[derive(Deserialize, Default)]
        #[serde(deny_unknown_fields, default)]
        struct Limits {
            body_bytes: usize,
        }
        let file = File::parse(
            "listen = \"127.0.0.1:9\"\nenvironment = \"e\"\n[limits]\nbody_bytes = 7\n",
            "gate.toml",
        )
        .unwrap();
        let face: Face = file.section().unwrap();
        assert_eq!(face.listen.as_deref(), Some("127.0.0.1:9"));
        assert_eq!(face.limits.body_bytes, 7);
        let typo = File::parse("[limits]\nbody = 7\n", "gate.toml").unwrap();
        let e = typo.section::<Face>().err().unwrap().to_string();
        assert_eq!(
            e,
            "gate.toml:2:1: field `body`: unknown field `body`, expected `body_bytes`"
        );
        let development: Face = File::development().section().unwrap();
        assert!(development.listen.is_none());
    }

    #[test]
    fn the_development_set_up_runs_from_a_directory_without_contracts() {
        let dir = tempfile::tempdir().unwrap();
        let mut file = File::development();
        file.base = dir.path().to_path_buf();
        let contracts = file.contracts().unwrap();
        assert!(contracts.iter().any(|c| c.name == "tickets.create"));
        // A configured file is held to what it names.
        let mut configured = File::from_config(Config::development());
        configured.base = dir.path().to_path_buf();
        let e = configured.contracts().unwrap_err().to_string();
        assert!(
            e.starts_with("contracts: contract pattern `contracts/*.yaml`"),
            "{e}"
        );
    }
}
