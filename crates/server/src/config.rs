//! The HTTP gateway's sections of the configuration file: where it listens and is reached,
//! the bounds on what a caller may send, the tenants' tokens and the webhook sources.
//!
//! The file's layout and the application's part of it (store, environment, contracts, sandbox,
//! recovery, executor, encryption key, the tenants' names) are `idemgate_app::config`'s; this
//! module reads the gateway's own sections from the same text ([`Config::read`]). Unknown
//! fields are errors, and every error names the file, the line and the field, so a typo in a
//! token's role never silently becomes a default.

use std::net::SocketAddr;

use idemgate_app::config::File;
use serde::Deserialize;

use crate::auth::Role;

/// The address `idemgate serve` listens on unless told otherwise: loopback only, because the
/// development defaults print a token anyone on the machine could use.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

/// The gateway's sections as written. Top-level keys of other layers are taken by the file's
/// layout (`idemgate_app::config`), which refuses keys nobody knows.
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Where callers reach this gateway (`https://gateway.example`), the start of every
    /// problem's `type` URI (`<public_url>/problems/<code>`). Unset: `http://<listen>`, or a
    /// relative `/problems/<code>` when `listen` is every address (`0.0.0.0`, `[::]`).
    #[serde(default)]
    pub public_url: Option<String>,
    #[serde(default)]
    pub limits: Limits,
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
            key_part_bytes: idemgate_app::assembly::DEFAULT_KEY_PART_BYTES,
            max_wait_seconds: 30,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// The tenant part of every operation key its tokens create (checked by the application's
    /// layer of the file).
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

/// A configuration that could not be read or accepted: the same file, line, column and field
/// report as a contract's.
pub use idemgate_app::config::Error;

/// The configuration file and the gateway's sections of it.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub file: File,
    pub config: Config,
}

impl Loaded {
    /// Reads and checks a configuration file: the application's part and the gateway's.
    pub fn load(path: &std::path::Path) -> Result<Loaded, Error> {
        let file = File::load(path)?;
        let config = Config::read(&file)?;
        Ok(Loaded { file, config })
    }

    /// The development set-up: no file; SQLite in the working directory, the embedded example
    /// contracts, the sandbox, no tenants (the gateway adds generated development tokens).
    pub fn development() -> Loaded {
        Loaded {
            file: File::development(),
            config: Config::development(),
        }
    }
}

impl Config {
    /// The development defaults of the gateway's sections.
    pub fn development() -> Config {
        Config {
            listen: default_listen(),
            public_url: None,
            limits: Limits::default(),
            tenants: Vec::new(),
            webhooks: Default::default(),
        }
    }

    /// The gateway's sections of `file`, checked.
    pub fn read(file: &File) -> Result<Config, Error> {
        let config: Config = file.section()?;
        config.check(file)?;
        Ok(config)
    }

    /// The configured base of problem type URIs, if any (checked when the file was read).
    pub fn public_url(&self) -> Option<crate::problems::ProblemBase> {
        self.public_url
            .as_deref()
            .and_then(|url| crate::problems::ProblemBase::parse(url).ok())
    }

    fn check(&self, file: &File) -> Result<(), Error> {
        if let Some(url) = &self.public_url {
            crate::problems::ProblemBase::parse(url).map_err(|m| file.error("public_url", m))?;
        }
        if self.limits.body_bytes < 64
            || self.limits.json_depth < 2
            || self.limits.key_part_bytes < 1
        {
            return Err(file.error(
                "limits",
                "body_bytes must be at least 64, json_depth at least 2, key_part_bytes at least 1",
            ));
        }
        for (name, source) in &self.webhooks {
            crate::webhooks::tolerance_within_retention(source)
                .map_err(|m| file.error(&format!("webhooks.{name}"), m))?;
        }
        let mut seen = std::collections::BTreeSet::new();
        for tenant in &self.tenants {
            for token in &tenant.tokens {
                let hex = token.sha256.trim();
                if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(file.error(
                        "sha256",
                        format!(
                            "token `{}` of tenant `{}`: sha256 must be 64 hex digits",
                            token.name, tenant.name
                        ),
                    ));
                }
                if !seen.insert(hex.to_ascii_lowercase()) {
                    return Err(file.error(
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, Error> {
        Config::read(&File::parse(text, "gate.toml")?)
    }

    fn check(text: &str, expect: Result<(), &str>) {
        match (parse(text), expect) {
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
        // Regression (issue 31): a tolerance longer than the dedup retention is refused at
        // load, naming the source; equal is accepted.
        check(
            &format!("\n{source}tolerance = \"2h\"\nretention = \"1h\"\n"),
            Err(
                "gate.toml:2: field `webhooks.jobs`: tolerance 2h is longer than retention 1h: an event replayed after its id is forgotten would still carry an accepted timestamp and be acted on again; set tolerance at most retention",
            ),
        );
        check(
            &format!("{source}tolerance = \"1h\"\nretention = \"1h\"\n"),
            Ok(()),
        );
        let typo = format!("{source}retention_days = 3\n");
        let e = parse(&typo).unwrap_err().to_string();
        assert!(e.contains("unknown field `retention_days`"), "{e}");
        check(
            "listen = \"127.0.0.1:0\"\nenvironment = \"prod\"\n[limits]\nbody_bytes = 1024\n",
            Ok(()),
        );
        // The file's layout (unknown keys, the application's part) is checked by
        // `idemgate_app::config`'s tests.
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
            "[limits]\nbody_bytes = 10\n",
            Err(
                "gate.toml:1: field `limits`: body_bytes must be at least 64, json_depth at least 2, key_part_bytes at least 1",
            ),
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
    }
}
