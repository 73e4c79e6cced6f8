//! The gateway's configuration: a TOML file read strictly, or the development defaults.
//!
//! Unknown fields are errors, and every error names the file, the line and the field, so a
//! typo in a token's role never silently becomes a default.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::auth::Role;

/// The address `idemgate serve` listens on unless told otherwise: loopback only, because the
/// development defaults print a token anyone on the machine could use.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// The embedded store of a gateway without configuration, in the working directory.
pub const DEFAULT_STORE: &str = "sqlite://idemgate.sqlite";
/// Where the example contracts live in a checkout.
pub const DEFAULT_CONTRACTS: &str = "contracts/*.yaml";

/// The configuration as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Where callers reach this gateway (`https://gateway.example`), the start of every
    /// problem's `type` URI (`<public_url>/problems/<code>`). Unset: `http://<listen>`, or a
    /// relative `/problems/<code>` when `listen` is every address (`0.0.0.0`, `[::]`).
    #[serde(default)]
    pub public_url: Option<String>,
    /// The environment part of every operation key (`tenant:environment:workflow:step`).
    #[serde(default = "default_environment")]
    pub environment: String,
    /// `sqlite://PATH` or `postgres://…`.
    #[serde(default = "default_store")]
    pub store: String,
    /// Contract files or globs (`*` within the file name). Relative paths are read from the
    /// directory of the configuration file.
    #[serde(default = "default_contracts")]
    pub contracts: Vec<String>,
    /// Perform every tool's effect against the in-process sandbox instead of its declared
    /// downstream. For trying the gateway out; effects are not real.
    #[serde(default)]
    pub sandbox: bool,
    /// The environment variable that holds the key for encrypting stored results at rest.
    /// Not implemented yet: a gateway configured with one refuses to start rather than store
    /// results in the clear while the operator believes otherwise.
    #[serde(default)]
    pub encryption_key_env: Option<String>,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub recovery: RecoveryConfig,
    #[serde(default)]
    pub executor: ExecutorConfig,
    #[serde(default)]
    pub mcp: McpConfig,
    #[serde(default)]
    pub tenants: Vec<TenantConfig>,
    /// Webhook sources, `[webhooks.<source>]`, each served at `POST /v1/webhooks/<source>`
    /// (see `crate::webhooks::SourceConfig`).
    #[serde(default)]
    pub webhooks: std::collections::BTreeMap<String, crate::webhooks::SourceConfig>,
}

/// Bounds on what a caller may send.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Largest request body accepted, in bytes.
    pub body_bytes: usize,
    /// Deepest nesting of a request body, the envelope included.
    pub json_depth: usize,
    /// Longest `workflow_id` or `step_id`, in bytes (the joined key is bounded to 255 too).
    pub key_part_bytes: usize,
    /// Longest `Prefer: wait=N` honoured, in seconds.
    pub max_wait_seconds: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            body_bytes: 256 * 1024,
            json_depth: 32,
            key_part_bytes: 128,
            max_wait_seconds: 30,
        }
    }
}

/// How often the background recoverer and the retention sweeper run.
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

/// The executor's tunables.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ExecutorConfig {
    /// Settled records kept in memory so that their replays read no row (0: none).
    pub settled_records: usize,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        ExecutorConfig {
            settled_records: idemgate_engine::Settings::default().settled_records,
        }
    }
}

/// The MCP face at `/mcp` (streamable HTTP, the same bearer tokens as the API).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct McpConfig {
    /// Accepted `Host` header values at `/mcp` (`name` or `name:port`), a guard against DNS
    /// rebinding. Unset: the loopback names and the listen address's host. An empty list
    /// accepts any host.
    pub allowed_hosts: Option<Vec<String>>,
    /// How a call without `_meta` is named: `"meta"` (the default; a key-based call without
    /// it is rejected) or `"session_window"` / `"session_window:DURATION"` (the key is derived
    /// from the caller, the session, the tool and the fingerprint). A contract's `identity`
    /// wins. `idemgate mcp --identity` overrides it for stdio.
    pub identity: idemgate_core::contract::Identity,
}

impl McpConfig {
    /// The `Host` values `/mcp` accepts for a gateway listening on `listen`.
    pub fn hosts(&self, listen: SocketAddr) -> Vec<String> {
        if let Some(hosts) = &self.allowed_hosts {
            return hosts.clone();
        }
        let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "::1"].map(String::from).into();
        let own = listen.ip().to_string();
        if !hosts.contains(&own) {
            hosts.push(own);
        }
        hosts
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// The tenant part of every operation key its tokens create.
    pub name: String,
    #[serde(default)]
    pub tokens: Vec<TokenConfig>,
}

/// A bearer token, stored only as the SHA-256 of its text.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// Who holds it: recorded as the actor of operations and operator actions.
    pub name: String,
    /// Lowercase hex SHA-256 of the token (`printf %s "$TOKEN" | sha256sum`).
    pub sha256: String,
    pub role: Role,
}

fn default_listen() -> SocketAddr {
    DEFAULT_LISTEN.parse().expect("the default address parses")
}
fn default_environment() -> String {
    "development".into()
}
fn default_store() -> String {
    DEFAULT_STORE.into()
}
fn default_contracts() -> Vec<String> {
    vec![DEFAULT_CONTRACTS.into()]
}

/// A configuration that could not be read or accepted: the same file, line, column and field
/// report as a contract's.
pub use idemgate_core::contract::LoadError as Error;

/// A loaded configuration and where relative paths in it are read from.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Config,
    pub base: PathBuf,
    /// Whether this is the no-configuration development set-up.
    pub development: bool,
}

impl Config {
    /// The development defaults: embedded SQLite, the example contracts, no tenants (the
    /// caller adds a generated development token).
    pub fn development() -> Config {
        Config {
            listen: default_listen(),
            public_url: None,
            environment: default_environment(),
            store: default_store(),
            contracts: default_contracts(),
            sandbox: true,
            encryption_key_env: None,
            limits: Limits::default(),
            recovery: RecoveryConfig::default(),
            executor: ExecutorConfig::default(),
            mcp: McpConfig::default(),
            tenants: Vec::new(),
            webhooks: Default::default(),
        }
    }

    /// Reads and checks a configuration file.
    pub fn load(path: &Path) -> Result<Loaded, Error> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| Error {
            file: file.clone(),
            line: None,
            column: None,
            field: None,
            message: format!("cannot be read: {e}"),
        })?;
        let config = Config::parse(&text, &file)?;
        let base = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        Ok(Loaded {
            config,
            base,
            development: false,
        })
    }

    /// Parses TOML text; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<Config, Error> {
        let config: Config = toml::from_str(text).map_err(|e| {
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
        })?;
        config.check(text, file)?;
        Ok(config)
    }

    /// The configured base of problem type URIs, if any (checked when the file was read).
    pub fn public_url(&self) -> Option<crate::problems::ProblemBase> {
        self.public_url
            .as_deref()
            .and_then(|url| crate::problems::ProblemBase::parse(url).ok())
    }

    fn check(&self, text: &str, file: &str) -> Result<(), Error> {
        let err = |field: &str, message: String| Error {
            file: file.to_string(),
            line: line_of(text, field),
            column: None,
            field: Some(field.to_string()),
            message,
        };
        let part_ok =
            |s: &str| !s.is_empty() && s.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b':');
        if !part_ok(&self.environment) {
            return Err(err(
                "environment",
                "must be printable ASCII without spaces or `:` (it is part of every operation key)"
                    .into(),
            ));
        }
        if let Some(url) = &self.public_url {
            crate::problems::ProblemBase::parse(url).map_err(|m| err("public_url", m))?;
        }
        if self.contracts.is_empty() {
            return Err(err(
                "contracts",
                "name at least one contract file or glob".into(),
            ));
        }
        if self.limits.body_bytes < 64
            || self.limits.json_depth < 2
            || self.limits.key_part_bytes < 1
        {
            return Err(err(
                "limits",
                "body_bytes must be at least 64, json_depth at least 2, key_part_bytes at least 1"
                    .into(),
            ));
        }
        if self.recovery.interval_seconds == 0 || self.recovery.sweep_interval_seconds == 0 {
            return Err(err(
                "recovery",
                "intervals must be at least one second".into(),
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for tenant in &self.tenants {
            if !part_ok(&tenant.name) {
                return Err(err(
                    "name",
                    format!(
                        "tenant name `{}` must be printable ASCII without spaces or `:`",
                        tenant.name.escape_default()
                    ),
                ));
            }
            for token in &tenant.tokens {
                let hex = token.sha256.trim();
                if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(err(
                        "sha256",
                        format!(
                            "token `{}` of tenant `{}`: sha256 must be 64 hex digits",
                            token.name, tenant.name
                        ),
                    ));
                }
                if !seen.insert(hex.to_ascii_lowercase()) {
                    return Err(err(
                        "sha256",
                        format!(
                            "token `{}` of tenant `{}` has the same hash as another token",
                            token.name, tenant.name
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, expect: Result<(), &str>) {
        match (Config::parse(text, "gate.toml"), expect) {
            (Ok(_), Ok(())) => {}
            (Err(e), Err(shown)) => assert_eq!(e.to_string(), shown),
            (got, expect) => panic!("{text}: got {got:?}, expected {expect:?}"),
        }
    }

    #[test]
    fn configs() {
        check("", Ok(()));
        // A webhook source is read strictly too.
        let source = "[webhooks.jobs]\ntenant = \"acme\"\nsecret_envs = [\"S\"]\n\
                      job_id_pointer = \"/id\"\noutcome_pointer = \"/type\"\n\
                      success = [\"done\"]\nreference_pointer = \"/ref\"\n";
        check(source, Ok(()));
        let typo = format!("{source}retention_days = 3\n");
        let e = Config::parse(&typo, "gate.toml").unwrap_err().to_string();
        assert!(e.contains("unknown field `retention_days`"), "{e}");
        check(
            "listen = \"127.0.0.1:0\"\nenvironment = \"prod\"\n[limits]\nbody_bytes = 1024\n",
            Ok(()),
        );
        check(
            "listen = \"127.0.0.1:0\"\nlisten_on = 1\n",
            Err(
                "gate.toml:2:1: field `listen_on`: unknown field `listen_on`, expected one of `listen`, `public_url`, `environment`, `store`, `contracts`, `sandbox`, `encryption_key_env`, `limits`, `recovery`, `executor`, `mcp`, `tenants`, `webhooks`",
            ),
        );
        check("public_url = \"https://gateway.example/\"\n", Ok(()));
        check(
            "listen = \"127.0.0.1:0\"\npublic_url = \"gateway.example\"\n",
            Err(
                "gate.toml:2: field `public_url`: \"gateway.example\" must start with http:// or https://",
            ),
        );
        check(
            "[limits]\nbody_bytes = \"big\"\n",
            Err("gate.toml:2:14: field `body_bytes`: invalid type: string \"big\", expected usize"),
        );
        check(
            "[[tenants]]\nname = \"acme\"\n[[tenants.tokens]]\nname = \"a\"\nsha256 = \"00\"\nrole = \"agent\"\n",
            Err(
                "gate.toml:5: field `sha256`: token `a` of tenant `acme`: sha256 must be 64 hex digits",
            ),
        );
        check(
            &format!(
                "[[tenants]]\nname = \"acme\"\n[[tenants.tokens]]\nname = \"a\"\nsha256 = \"{}\"\nrole = \"admin\"\n",
                "0".repeat(64)
            ),
            Err(
                "gate.toml:6:8: field `role`: unknown variant `admin`, expected `agent` or `operator`",
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
            "[mcp]\nallowed_host = []\n",
            Err(
                "gate.toml:2:1: field `allowed_host`: unknown field `allowed_host`, expected `allowed_hosts` or `identity`",
            ),
        );
    }

    #[test]
    fn mcp_hosts_default_to_loopback_and_the_listen_address() {
        let listen: SocketAddr = "10.0.0.7:8080".parse().unwrap();
        let config = Config::parse("", "gate.toml").unwrap();
        assert_eq!(
            config.mcp.hosts(listen),
            ["localhost", "127.0.0.1", "::1", "10.0.0.7"]
        );
        let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
        assert_eq!(
            config.mcp.hosts(loopback),
            ["localhost", "127.0.0.1", "::1"]
        );
        let config = Config::parse(
            "[mcp]\nallowed_hosts = [\"gate.example\", \"gate.example:8443\"]\n",
            "gate.toml",
        )
        .unwrap();
        assert_eq!(
            config.mcp.hosts(listen),
            ["gate.example", "gate.example:8443"]
        );
        let any = Config::parse("[mcp]\nallowed_hosts = []\n", "gate.toml").unwrap();
        assert!(
            any.mcp.hosts(listen).is_empty(),
            "an empty list accepts any host"
        );
    }

    #[test]
    fn mcp_identity_defaults_to_meta_and_reads_a_window() {
        use idemgate_core::contract::Identity;
        use idemgate_core::duration::Span;
        assert_eq!(
            Config::parse("", "gate.toml").unwrap().mcp.identity,
            Identity::Meta
        );
        let windowed =
            Config::parse("[mcp]\nidentity = \"session_window:90s\"\n", "gate.toml").unwrap();
        assert_eq!(windowed.mcp.identity, Identity::SessionWindow(Span(90)));
        let bad = Config::parse("[mcp]\nidentity = \"per_call\"\n", "gate.toml").unwrap_err();
        let shown = bad.to_string();
        assert!(
            shown.contains("field `identity`") && shown.contains("not one of `meta`"),
            "{shown}"
        );
    }
}
