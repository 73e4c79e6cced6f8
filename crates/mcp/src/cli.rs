//! `idemgate mcp`: the contracts as MCP tools over stdio, for one local agent.
//!
//! The binary opens the store from `--store` and calls [`run`]; everything else — loading
//! contracts and building their downstreams — is here; the executor, the recoverer and the
//! stdio server are put together by [`crate::assembly`], which `idemgate wrap` shares.
//! With `--config FILE` (the gateway's TOML configuration) the binary hands the flags to
//! `idemgate_server::mcp::stdio` instead, which reads the file with the gateway's own loader.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use idemgate_core::contract::{Contract, LoadError};
use idemgate_core::effect::Authorizer;
use idemgate_core::store::Store;
use idemgate_downstream_http::{AuthorizerByTool, HttpDownstream};

use crate::adapter::{self, Options};
use crate::assembly::{self, Assembly, Local, Recovery, Tool};
use crate::fake::FakeDownstreams;
use crate::gateway::{self, Gateway};

/// Flags of `idemgate mcp`.
#[derive(Debug, Clone, clap::Args)]
pub struct McpArgs {
    /// The gateway's configuration file (TOML, as for `idemgate serve --config`): the store,
    /// the environment, the contracts and `sandbox` come from it, and `--tenant` must be one
    /// of its tenants. Replaces `--store`, `--contracts` and `--environment`.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["store", "contracts", "environment"])]
    pub config: Option<PathBuf>,
    /// Operation store: `sqlite://PATH` or `postgres://…`.
    #[arg(
        long,
        value_name = "URL",
        default_value = "sqlite://idemgate.sqlite",
        env = "IDEMGATE_STORE"
    )]
    pub store: String,
    /// Contract files; a `*` in the last path segment is expanded here, so the default works
    /// without a shell.
    #[arg(long, value_name = "GLOB", num_args = 1.., default_value = "contracts/*.yaml")]
    pub contracts: Vec<String>,
    /// The tenant every operation of this local agent belongs to (with `--config`, one of the
    /// configuration's tenants).
    #[arg(long, default_value = "local", env = "IDEMGATE_TENANT")]
    pub tenant: String,
    /// The environment part of every operation key.
    #[arg(long, default_value = "development", env = "IDEMGATE_ENVIRONMENT")]
    pub environment: String,
    /// Who is recorded as the actor of each operation.
    #[arg(long, default_value = "mcp-stdio", env = "IDEMGATE_ACTOR")]
    pub actor: String,
    /// Send every effect to an in-process fake system of record (per contract, deduplicating
    /// and offering lookups as the contract declares), for demos and tests. Also serves the
    /// hidden `idemgate_fake_downstream` tool that reads and scripts the fakes.
    #[arg(long)]
    pub fake_downstream: bool,
    /// How a call without `_meta` is named: `meta` (default: a key-based call without it is
    /// rejected) or `session_window[:DURATION]` (for hosts that cannot send `_meta`: the same
    /// call within the window — default 10m — is one operation; `repeat_of` asks for another).
    /// With `--config`, overrides its `[mcp] identity`.
    #[arg(long, value_name = "RULE", env = "IDEMGATE_IDENTITY")]
    pub identity: Option<idemgate_core::contract::Identity>,
}

/// Why `idemgate mcp` could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("{pattern}: {message}")]
    Glob { pattern: String, message: String },
    #[error("no contract files match {0:?}")]
    NoContracts(Vec<String>),
    #[error("{path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Contract(#[from] LoadError),
    #[error(transparent)]
    Assembly(#[from] assembly::Error),
    #[error("{0}")]
    Downstream(String),
    #[error(transparent)]
    Gateway(#[from] gateway::Error),
    #[error(transparent)]
    Serve(#[from] adapter::Error),
    #[error("--config is read by the idemgate binary (idemgate_server::mcp::stdio), not here")]
    Config,
}

/// Expands one pattern: a `*` may appear in the last path segment only (`contracts/*.yaml`);
/// a pattern without `*` names a file. Matches are sorted, so tools list in a stable order.
pub fn expand(pattern: &str) -> Result<Vec<PathBuf>, Error> {
    let glob_err = |message: &str| Error::Glob {
        pattern: pattern.to_string(),
        message: message.to_string(),
    };
    let path = Path::new(pattern);
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| glob_err("names no file"))?;
    if !name.contains('*') {
        if pattern.contains('*') {
            return Err(glob_err("`*` is only expanded in the last path segment"));
        }
        return Ok(vec![path.to_path_buf()]);
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if dir.to_string_lossy().contains('*') {
        return Err(glob_err("`*` is only expanded in the last path segment"));
    }
    let entries = std::fs::read_dir(&dir).map_err(|e| glob_err(&e.to_string()))?;
    let mut found: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter(|e| e.file_name().to_str().is_some_and(|n| wildcard(name, n)))
        .map(|e| e.path())
        .collect();
    found.sort();
    Ok(found)
}

/// `*` matches any run of characters; everything else matches itself.
fn wildcard(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if parts.len() == 1 {
        return pattern == text;
    }
    if !text.starts_with(first) || text.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    if !text.ends_with(last) {
        return false;
    }
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(at) => rest = &rest[at + middle.len()..],
            None => return false,
        }
    }
    true
}

/// Loads every contract the patterns name.
pub fn load_contracts(patterns: &[String]) -> Result<Vec<Arc<Contract>>, Error> {
    let mut files = Vec::new();
    for pattern in patterns {
        files.extend(expand(pattern)?);
    }
    if files.is_empty() {
        return Err(Error::NoContracts(patterns.to_vec()));
    }
    let mut contracts = Vec::new();
    for file in files {
        let name = file.display().to_string();
        let text = std::fs::read_to_string(&file).map_err(|source| Error::Read {
            path: name.clone(),
            source,
        })?;
        contracts.push(Arc::new(Contract::load(&text, &name)?));
    }
    Ok(contracts)
}

impl McpArgs {
    fn local(&self) -> Local {
        Local {
            tenant: self.tenant.clone(),
            environment: self.environment.clone(),
            actor: self.actor.clone(),
            identity: self.identity.unwrap_or_default(),
        }
    }
}

/// The tools with their effects, the authorization hooks (`None`: allow all), and the fakes
/// when `--fake-downstream` built them.
pub type Effects = (
    Vec<Tool>,
    Option<Arc<dyn Authorizer>>,
    Option<FakeDownstreams>,
);

/// The tools of `idemgate mcp` and their effects: each contract's HTTP downstream and its
/// authorization hooks, or with `--fake-downstream` the in-process fakes (hooks included).
pub fn tools(args: &McpArgs, contracts: &[Arc<Contract>]) -> Result<Effects, Error> {
    if args.fake_downstream {
        let fakes = FakeDownstreams::for_contracts(contracts);
        let mut tools = Vec::new();
        for contract in contracts {
            let downstream =
                fakes
                    .downstream(&contract.name)
                    .ok_or_else(|| gateway::Error::Downstream {
                        tool: contract.name.clone(),
                        message: "no fake downstream".into(),
                    })?;
            tools.push(Tool {
                contract: contract.clone(),
                downstream,
            });
        }
        return Ok((tools, None, Some(fakes)));
    }
    let hooks = AuthorizerByTool::from_contracts(contracts.iter().map(|c| c.as_ref()))
        .map_err(|e| Error::Downstream(e.to_string()))?;
    let mut tools = Vec::new();
    for contract in contracts {
        let downstream =
            HttpDownstream::from_contract(contract).map_err(|e| gateway::Error::Downstream {
                tool: contract.name.clone(),
                message: format!("{e} (run with --fake-downstream to try the tools without one)"),
            })?;
        tools.push(Tool {
            contract: contract.clone(),
            downstream: Arc::new(downstream),
        });
    }
    Ok((tools, Some(Arc::new(hooks)), None))
}

/// Builds the assembly for `args` over `store`. With `--fake-downstream`, returns the fakes
/// too.
pub fn assemble(
    args: &McpArgs,
    store: Arc<dyn Store>,
    contracts: Vec<Arc<Contract>>,
) -> Result<(Assembly, Option<FakeDownstreams>), Error> {
    let (tools, authorizer, fakes) = tools(args, &contracts)?;
    let assembly = Assembly::new(args.local(), store, authorizer, tools, Recovery::default())?;
    Ok((assembly, fakes))
}

/// Runs `idemgate mcp` until the client closes stdin, or Ctrl-C / SIGTERM.
/// Serves the tools over stdio until the client closes the stream or `shutdown` completes (the
/// binary passes Ctrl-C and SIGTERM).
pub async fn run(
    args: McpArgs,
    store: Arc<dyn Store>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    if args.config.is_some() {
        return Err(Error::Config);
    }
    let contracts = load_contracts(&args.contracts)?;
    let (assembly, fakes) = assemble(&args, store, contracts)?;
    tracing::info!(
        tools = assembly.gateway().tools().len(),
        tenant = args.tenant,
        environment = args.environment,
        fake_downstream = args.fake_downstream,
        "serving MCP over stdio"
    );
    let options = Options {
        fakes,
        identity: args.identity.unwrap_or_default(),
        ..Options::default()
    };
    Ok(assembly.serve_stdio(options, shutdown).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_match_like_a_shell_in_one_segment() {
        for (pattern, text, expect) in [
            ("*.yaml", "tickets.create.yaml", true),
            ("*.yaml", "tickets.create.yml", false),
            ("tickets.*.yaml", "tickets.get.yaml", true),
            ("tickets.*.yaml", "email.send.yaml", false),
            ("*", "anything", true),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "acb", false),
            ("ab*ba", "aba", false),
            ("exact", "exact", true),
        ] {
            assert_eq!(wildcard(pattern, text), expect, "{pattern} ~ {text}");
        }
    }

    #[test]
    fn expand_lists_sorted_files_and_refuses_stars_in_directories() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["b.yaml", "a.yaml", "c.txt"] {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        let pattern = format!("{}/*.yaml", dir.path().display());
        let found: Vec<String> = expand(&pattern)
            .unwrap()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(found, ["a.yaml", "b.yaml"]);
        assert!(expand("contr*/x.yaml").is_err());
    }
}
