//! A real `idemgate serve` for the operators' tests: a configuration in a temporary directory
//! with known tokens, a free loopback port, and the process killed when the test ends (also a
//! failing one). `ops` runs the real `idemgate ops` binary against it; `invoke` and `operation`
//! talk to the API directly, so assertions never rest on the CLI's own reading.

#![allow(dead_code)] // Each test file uses its own part of the support.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use idemgate_server::auth::hash_token;
use serde_json::{Value, json};

/// Tenant `acme`: an operator and an agent. Tenant `other`: an operator.
pub const OPERATOR: &str = "idg_test_operator_of_acme";
pub const AGENT: &str = "idg_test_agent_of_acme";
pub const OTHER_OPERATOR: &str = "idg_test_operator_of_other";
pub const ENVIRONMENT: &str = "ci";

/// How long a gateway may take to start, and any one CLI run to finish.
const START_LIMIT: Duration = Duration::from_secs(30);
const RUN_LIMIT: Duration = Duration::from_secs(90);

/// The `[[tenants]]` tables of the tokens above.
pub fn tenants() -> String {
    format!(
        r#"
[[tenants]]
name = "acme"

[[tenants.tokens]]
name = "alice"
sha256 = "{}"
role = "operator"

[[tenants.tokens]]
name = "bot"
sha256 = "{}"
role = "agent"

[[tenants]]
name = "other"

[[tenants.tokens]]
name = "mallory"
sha256 = "{}"
role = "operator"
"#,
        hash_token(OPERATOR),
        hash_token(AGENT),
        hash_token(OTHER_OPERATOR)
    )
}

/// The repository's example contracts, which the sandbox serves.
pub fn example_contracts() -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contracts");
    format!("{}/*.yaml", dir.display())
}

/// The head of a configuration: loopback on a free port, the environment, a store in `dir`,
/// the contracts, and a recoverer that stays out of the way (every settlement in these tests
/// is an operator's, or a delivery's).
pub fn config_head(dir: &Path, contracts: &str, sandbox: bool) -> String {
    format!(
        r#"listen = "127.0.0.1:0"
environment = "{ENVIRONMENT}"
store = "sqlite://{}"
contracts = [{:?}]
sandbox = {sandbox}

[recovery]
interval_seconds = 3600
sweep_interval_seconds = 3600
"#,
        dir.join("gate.sqlite").display(),
        contracts
    )
}

pub struct Gateway {
    child: Child,
    pub url: String,
    pub dir: PathBuf,
    _dir: tempfile::TempDir,
}

impl Gateway {
    /// Starts `idemgate serve --config` on `config` (written to `gate.toml` in `dir`).
    pub fn start(dir: tempfile::TempDir, config: &str) -> Gateway {
        let path = dir.path().join("gate.toml");
        std::fs::write(&path, config).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_idemgate"))
            .args(["serve", "--config"])
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start idemgate serve");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        // Keeps reading so that the gateway never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + START_LIMIT;
        let url = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(url) = line.strip_prefix("idemgate listening on ") {
                        break url.trim().to_string();
                    }
                }
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("idemgate serve did not start within {START_LIMIT:?}: {e}");
                }
            }
        };
        let gateway = Gateway {
            child,
            url,
            dir: dir.path().to_path_buf(),
            _dir: dir,
        };
        gateway.wait_healthy();
        gateway
    }

    fn wait_healthy(&self) {
        let deadline = Instant::now() + START_LIMIT;
        let addr = self.url.trim_start_matches("http://").to_string();
        while Instant::now() < deadline {
            if let Ok(mut s) = std::net::TcpStream::connect(&addr) {
                use std::io::{Read, Write};
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let request =
                    format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
                if s.write_all(request.as_bytes()).is_ok() {
                    let mut answer = String::new();
                    let _ = s.read_to_string(&mut answer);
                    if answer.starts_with("HTTP/1.1 200") {
                        return;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("{} never answered /healthz with 200", self.url);
    }

    /// Stops the gateway now (a gateway that is down, for the tests that need one).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What one CLI run printed, and its exit status.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn json(&self) -> Value {
        serde_json::from_str(self.stdout.trim())
            .unwrap_or_else(|e| panic!("not one JSON document ({e}): {self:?}"))
    }
}

/// Runs `idemgate ARGS` with `IDEMGATE_GATEWAY` and `IDEMGATE_TOKEN` (unset when `None`),
/// standard input closed (so never a terminal), within a time limit.
pub fn idemgate(gateway: Option<&str>, token: Option<&str>, args: &[&str]) -> Run {
    idemgate_with(gateway, token, &[], args)
}

/// [`idemgate`] with more variables set.
pub fn idemgate_with(
    gateway: Option<&str>,
    token: Option<&str>,
    vars: &[(&str, &str)],
    args: &[&str],
) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_idemgate"));
    cmd.envs(vars.iter().copied());
    cmd.args(args)
        .env_remove("IDEMGATE_GATEWAY")
        .env_remove("IDEMGATE_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(url) = gateway {
        cmd.env("IDEMGATE_GATEWAY", url);
    }
    if let Some(token) = token {
        cmd.env("IDEMGATE_TOKEN", token);
    }
    let mut child = cmd.spawn().expect("run idemgate");
    let deadline = Instant::now() + RUN_LIMIT;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("idemgate {args:?} still running after {RUN_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// `idemgate ops ARGS` against `gateway` with `token`, off the test's runtime threads (a fake
/// downstream in the test may have to answer the gateway meanwhile).
pub async fn ops(gateway: &Gateway, token: &str, args: &[&str]) -> Run {
    let url = gateway.url.clone();
    let token = token.to_string();
    let mut all = vec!["ops".to_string()];
    all.extend(args.iter().map(|s| s.to_string()));
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = all.iter().map(String::as_str).collect();
        idemgate(Some(&url), Some(&token), &args)
    })
    .await
    .unwrap()
}

/// An answer of the API: status, whether it says it replayed, the body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub replayed: bool,
    pub body: Value,
}

fn http() -> reqwest::Client {
    idemgate_downstream_http::install_crypto_provider();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// One delivery of a tool call by the agent.
pub async fn invoke(
    gateway: &Gateway,
    tool: &str,
    workflow: &str,
    step: &str,
    arguments: Value,
) -> Answer {
    invoke_as(gateway, AGENT, tool, workflow, step, arguments).await
}

/// One delivery of a tool call with `token`.
pub async fn invoke_as(
    gateway: &Gateway,
    token: &str,
    tool: &str,
    workflow: &str,
    step: &str,
    arguments: Value,
) -> Answer {
    let response = http()
        .post(format!("{}/v1/tools/{tool}/invoke", gateway.url))
        .bearer_auth(token)
        .json(&json!({ "workflow_id": workflow, "step_id": step, "arguments": arguments }))
        .send()
        .await
        .expect("the gateway answers");
    answer(response).await
}

/// The operation as the API shows it to `token`.
pub async fn operation(gateway: &Gateway, token: &str, key: &str) -> Answer {
    let response = http()
        .get(format!("{}/v1/operations/{key}", gateway.url))
        .bearer_auth(token)
        .send()
        .await
        .expect("the gateway answers");
    answer(response).await
}

async fn answer(response: reqwest::Response) -> Answer {
    let status = response.status().as_u16();
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    let body = response.json().await.expect("a JSON answer");
    Answer {
        status,
        replayed,
        body,
    }
}

/// `acme:ci:<workflow>:<step>`.
pub fn key(workflow: &str, step: &str) -> String {
    format!("acme:{ENVIRONMENT}:{workflow}:{step}")
}

/// The kinds of an operation's events, in order.
pub fn kinds(operation: &Value) -> Vec<String> {
    operation["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect()
}
