//! `idemgate serve`'s logs as a collector reads them: `--log-format json` writes one object per
//! line with the request id, and never the arguments or the result; text written to a file has
//! no colour codes; every answer names its request id.

mod common;

use common::{Serve, header};
use idemgate_server::auth::hash_token;
use serde_json::Value;

const TOKEN: &str = "logs-test-agent-token";
/// An argument value that must never reach a log line.
const SECRET: &str = "Subject-6f1d-never-logged";

fn start(dir: &tempfile::TempDir, format: &str) -> Serve {
    let hash = hash_token(TOKEN);
    let contracts = concat!(env!("CARGO_MANIFEST_DIR"), "/../../contracts/*.yaml");
    let config = format!(
        "listen = \"127.0.0.1:0\"\nenvironment = \"logs\"\nstore = \"sqlite://{}/gate.sqlite\"\n\
         contracts = [\"{contracts}\"]\nsandbox = true\n[[tenants]]\nname = \"t1\"\n\
         [[tenants.tokens]]\nname = \"agent\"\nsha256 = \"{hash}\"\nrole = \"agent\"\n",
        dir.path().display()
    );
    Serve::start(dir.path(), &config, &["--log-format", format], &[])
}

fn invoke(serve: &Serve, request_id: Option<&str>) -> String {
    let auth = format!("Bearer {TOKEN}");
    let mut headers = vec![
        ("Authorization", auth.as_str()),
        ("Idempotency-Key", "\"run_1:record_issue\""),
        ("Content-Type", "application/json"),
    ];
    if let Some(id) = request_id {
        headers.push(("X-Request-Id", id));
    }
    let body = format!(r#"{{"arguments": {{"subject": "{SECRET}", "body": "{SECRET}"}}}}"#);
    serve.request("POST", "/v1/tools/tickets.create/invoke", &headers, &body)
}

#[test]
fn json_logs_carry_the_request_id_and_never_the_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let serve = start(&dir, "json");
    let first = invoke(&serve, Some("req-from-caller-1"));
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    assert_eq!(header(&first, "x-request-id"), Some("req-from-caller-1"));
    let second = invoke(&serve, None);
    assert!(second.starts_with("HTTP/1.1 200"), "{second}");
    let made = header(&second, "x-request-id")
        .expect("an answer names its request id")
        .to_string();
    assert_ne!(made, "req-from-caller-1");
    let metrics = serve.request("GET", "/metrics", &[], "");
    let logs = serve.stop();

    assert!(
        !logs.contains(SECRET),
        "an argument reached the log:\n{logs}"
    );
    let access: Vec<Value> = logs
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .filter(|v| v["target"] == "idemgate::access")
        .collect();
    let invokes: Vec<&Value> = access
        .iter()
        .filter(|v| v["route"] == "/v1/tools/{tool}/invoke")
        .collect();
    assert_eq!(invokes.len(), 2, "one access line per request:\n{logs}");
    let expected = [
        ("req-from-caller-1", "applied"),
        (made.as_str(), "replayed"),
    ];
    for (line, (id, outcome)) in invokes.iter().zip(expected) {
        assert_eq!(line["span"]["request_id"], id, "{line}");
        assert_eq!(line["outcome"], outcome, "{line}");
        assert_eq!(line["status"], 200, "{line}");
        assert_eq!(line["tenant"], "t1", "{line}");
        assert_eq!(line["tool"], "tickets.create", "{line}");
        assert_eq!(
            line["operation_key"], "t1:logs:run_1:record_issue",
            "{line}"
        );
        assert!(line["latency_ms"].as_f64().is_some(), "{line}");
        assert!(
            line["timestamp"].is_string() && line["level"] == "INFO",
            "{line}"
        );
    }
    // The engine's own line about the delivery names the same request.
    assert!(
        logs.lines()
            .filter(|l| l.contains("\"message\":\"delivery\""))
            .any(|l| l.contains("req-from-caller-1")),
        "{logs}"
    );
    assert!(
        metrics.contains(
            r#"idemgate_http_requests_total{route="/v1/tools/{tool}/invoke",method="POST",status="200"} 2"#
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains("idemgate_build_info{version="),
        "{metrics}"
    );
}

#[test]
fn text_logs_into_a_file_have_no_colour() {
    let dir = tempfile::tempdir().unwrap();
    let serve = start(&dir, "text");
    let answer = invoke(&serve, None);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let logs = serve.stop();
    assert!(logs.contains("request"), "an access line at info:\n{logs}");
    assert!(!logs.contains('\u{1b}'), "colour codes in a file:\n{logs}");
    assert!(
        !logs.contains(SECRET),
        "an argument reached the log:\n{logs}"
    );
}
