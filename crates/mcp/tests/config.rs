//! `idemgate mcp --config`: the configuration file's app over stdio (an in-memory pipe here),
//! the store, environment and contracts from the file, the tenant one of its tenants. Effects
//! are counted by the fake downstreams on their own side.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use idemgate_mcp::assembly::{ConfigError, ConfigOptions, from_config};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::oneshot;

const LIMIT: Duration = Duration::from_secs(20);

fn config_file(dir: &Path, tenants: &str) -> std::path::PathBuf {
    let contracts = concat!(env!("CARGO_MANIFEST_DIR"), "/../../contracts/*.yaml");
    let text = format!(
        "environment = \"staging\"\nstore = \"sqlite://{}\"\ncontracts = [{contracts:?}]\nsandbox = true\n{tenants}",
        dir.join("stdio.sqlite").display()
    );
    let path = dir.join("gate.toml");
    std::fs::write(&path, text).unwrap();
    path
}

const TENANTS: &str = "[[tenants]]\nname = \"acme\"\n[[tenants]]\nname = \"globex\"\n";

fn args(config: &Path, tenant: &str) -> ConfigOptions {
    ConfigOptions {
        config: config.to_path_buf(),
        tenant: tenant.into(),
        actor: "local-agent".into(),
        fake_downstream: true,
        identity: None,
    }
}

fn tools_call(id: u64, tool: &str, arguments: Value, step: (&str, &str)) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": tool, "arguments": arguments,
        "_meta": {"io.idemgate/operation": {"workflow_id": step.0, "step_id": step.1}}}})
}

fn outcome(answer: &Value) -> &Value {
    &answer["result"]["structuredContent"]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_over_stdio_takes_store_environment_and_contracts_from_the_config() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), TENANTS);
    let configured = from_config(&args(&config, "acme")).await.unwrap();
    assert_eq!(configured.caller.tenant, "acme");
    assert_eq!(configured.file.config.environment, "staging");
    let fakes = configured.fakes.clone().expect("--fake-downstream");

    let (client, server) = tokio::io::duplex(1 << 16);
    let (server_read, server_write) = tokio::io::split(server);
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let serving = tokio::spawn(idemgate_mcp::serve_io(
        Arc::new(configured.app),
        configured.caller,
        idemgate_mcp::Options {
            fakes: configured.fakes,
            ..Default::default()
        },
        server_read,
        server_write,
        async move {
            let _ = stop_rx.await;
        },
    ));
    let (read, mut write) = tokio::io::split(client);
    let mut read = BufReader::new(read);
    let mut request = async |message: Value| -> Value {
        let id = message["id"].clone();
        let mut line = message.to_string();
        line.push('\n');
        write.write_all(line.as_bytes()).await.unwrap();
        tokio::time::timeout(LIMIT, async {
            loop {
                let mut line = String::new();
                assert!(read.read_line(&mut line).await.unwrap() > 0, "EOF");
                let v: Value = serde_json::from_str(&line).unwrap();
                if v["id"] == id {
                    return v;
                }
            }
        })
        .await
        .expect("an answer in time")
    };

    let init = request(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "stdio-config-test", "version": "0"}}}),
    )
    .await;
    assert_eq!(init["result"]["serverInfo"]["name"], "idemgate");
    let ticket = json!({"subject": "Refund request", "body": "Order 42 arrived broken."});
    let first = request(tools_call(
        2,
        "tickets_create",
        ticket.clone(),
        ("run_9", "s"),
    ))
    .await;
    let again = request(tools_call(3, "tickets_create", ticket, ("run_9", "s"))).await;
    assert_eq!(outcome(&first)["status"], "applied", "{first}");
    assert_eq!(outcome(&first)["operation_key"], "acme:staging:run_9:s");
    assert_eq!(outcome(&again)["status"], "replayed", "{again}");
    let fake = fakes.get("tickets.create").unwrap();
    assert_eq!((fake.effects(), fake.calls()), (1, 1));
    // The hidden control tool reads the same fake.
    let stats = request(
        json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {
        "name": "idemgate_fake_downstream",
        "arguments": {"action": "stats", "tool": "tickets_create"}}}),
    )
    .await;
    assert_eq!(
        stats["result"]["structuredContent"]["effects"], 1,
        "{stats}"
    );

    let _ = stop_tx.send(());
    tokio::time::timeout(LIMIT, serving)
        .await
        .expect("the stdio server stops on shutdown")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn mcp_over_stdio_needs_one_of_the_configs_tenants() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), TENANTS);
    match from_config(&args(&config, "local")).await {
        Err(ConfigError::Usage(message)) => {
            assert!(message.contains("its tenants: acme, globex"), "{message}")
        }
        other => panic!("expected a refusal, got {:?}", other.err()),
    }
    let none = config_file(dir.path(), "");
    let refused = from_config(&args(&none, "acme")).await;
    assert!(matches!(refused, Err(ConfigError::Usage(m)) if m.contains("declares no tenants")));
    // A bad configuration is reported by the application's loader: file, line, field.
    std::fs::write(&config, "environment = \"a:b\"\n").unwrap();
    let message = from_config(&args(&config, "acme"))
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        message.contains("gate.toml:1: field `environment`"),
        "{message}"
    );
    // The `[mcp]` section is read strictly by this face.
    std::fs::write(
        &config,
        format!("{TENANTS}[mcp]\nidentity = \"per_call\"\n"),
    )
    .unwrap();
    let message = from_config(&args(&config, "acme"))
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(message.contains("field `identity`"), "{message}");
}
