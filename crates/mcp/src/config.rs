//! The MCP face's section of the configuration file, `[mcp]`: which `Host` values the
//! streamable-HTTP endpoint accepts, and how a call without `_meta` is named. Read from the
//! same file as the application's part (`idemgate_app::config::File::section`), by `idemgate
//! serve` for `/mcp` and by `idemgate mcp --config` for stdio.

use std::net::SocketAddr;

use idemgate_app::config::File;
use idemgate_core::contract::Identity;
use serde::Deserialize;

/// The file's `[mcp]` table, as a face section.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Section {
    pub mcp: McpConfig,
}

/// `[mcp]`: the MCP face (streamable HTTP at `/mcp` with the gateway's bearer tokens; stdio
/// with `idemgate mcp --config`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct McpConfig {
    /// Accepted `Host` header values at `/mcp` (`name` or `name:port`), a guard against DNS
    /// rebinding. Unset: the loopback names and the listen address's host. An empty list
    /// accepts any host.
    pub allowed_hosts: Option<Vec<String>>,
    /// How a call without `_meta` is named: `"meta"` (the default; a key-based call without
    /// it is rejected) or `"session_window"` / `"session_window:DURATION"` (the key is derived
    /// from the caller, the tool and the fingerprint). A contract's `identity` wins.
    /// `idemgate mcp --identity` overrides it for stdio.
    pub identity: Identity,
}

impl McpConfig {
    /// The `[mcp]` table of `file` (its defaults when the file has none).
    pub fn read(file: &File) -> Result<McpConfig, idemgate_app::config::Error> {
        Ok(file.section::<Section>()?.mcp)
    }

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

/// The streamable-HTTP MCP face over `app` as `[mcp]` configures it, for a server listening on
/// `listen` (`idemgate serve` mounts it at `/mcp`). `auth` maps a request's head to its caller
/// (the server's bearer tokens); `None` answers 401. Fails when a contract name cannot become
/// an MCP tool name.
pub fn http_service(
    app: &idemgate_app::App,
    config: &McpConfig,
    listen: SocketAddr,
    auth: impl Fn(&axum::http::request::Parts) -> Option<idemgate_engine::Caller>
    + Send
    + Sync
    + 'static,
) -> Result<crate::McpHttpService, crate::adapter::Error> {
    crate::streamable_http_service_with(
        std::sync::Arc::new(app.clone()),
        auth,
        crate::HttpOptions {
            allowed_hosts: config.hosts(listen),
            options: crate::Options {
                identity: config.identity,
                ..Default::default()
            },
            ..Default::default()
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<McpConfig, idemgate_app::config::Error> {
        McpConfig::read(&File::parse(text, "gate.toml")?)
    }

    #[test]
    fn hosts_default_to_loopback_and_the_listen_address() {
        let listen: SocketAddr = "10.0.0.7:8080".parse().unwrap();
        let config = parse("").unwrap();
        assert_eq!(
            config.hosts(listen),
            ["localhost", "127.0.0.1", "::1", "10.0.0.7"]
        );
        let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
        assert_eq!(config.hosts(loopback), ["localhost", "127.0.0.1", "::1"]);
        let config =
            parse("[mcp]\nallowed_hosts = [\"gate.example\", \"gate.example:8443\"]\n").unwrap();
        assert_eq!(config.hosts(listen), ["gate.example", "gate.example:8443"]);
        let any = parse("[mcp]\nallowed_hosts = []\n").unwrap();
        assert!(
            any.hosts(listen).is_empty(),
            "an empty list accepts any host"
        );
        assert_eq!(
            parse("[mcp]\nallowed_host = []\n").unwrap_err().to_string(),
            "gate.toml:2:1: field `allowed_host`: unknown field `allowed_host`, expected `allowed_hosts` or `identity`",
        );
    }

    #[test]
    fn identity_defaults_to_meta_and_reads_a_window() {
        use idemgate_core::duration::Span;
        assert_eq!(parse("").unwrap().identity, Identity::Meta);
        let windowed = parse("[mcp]\nidentity = \"session_window:90s\"\n").unwrap();
        assert_eq!(windowed.identity, Identity::SessionWindow(Span(90)));
        let shown = parse("[mcp]\nidentity = \"per_call\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            shown.contains("field `identity`") && shown.contains("not one of `meta`"),
            "{shown}"
        );
    }
}
