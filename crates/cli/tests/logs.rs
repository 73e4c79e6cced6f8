//! `idemgate serve`'s logs as a collector reads them: `--log-format json` writes one object per
//! line with the request id, and never the arguments or the result; text written to a file has
//! no colour codes; every answer names its request id.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const TOKEN: &str = "logs-test-agent-token";
/// An argument value that must never reach a log line.
const SECRET: &str = "Subject-6f1d-never-logged";

struct Serve {
    child: Child,
    addr: String,
    stderr: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Serve {
    fn start(format: &str) -> Serve {
        let dir = tempfile::tempdir().unwrap();
        let hash = sha256_hex(TOKEN);
        let contracts = concat!(env!("CARGO_MANIFEST_DIR"), "/../../contracts/*.yaml");
        let config = format!(
            "listen = \"127.0.0.1:0\"\nenvironment = \"logs\"\nstore = \"sqlite://{}/gate.sqlite\"\n\
             contracts = [\"{contracts}\"]\nsandbox = true\n[[tenants]]\nname = \"t1\"\n\
             [[tenants.tokens]]\nname = \"agent\"\nsha256 = \"{hash}\"\nrole = \"agent\"\n",
            dir.path().display()
        );
        let config_path = dir.path().join("gate.toml");
        std::fs::write(&config_path, config).unwrap();
        let stderr = dir.path().join("stderr.log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_idemgate"))
            .args(["serve", "--log-format", format, "--config"])
            .arg(&config_path)
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let deadline = Instant::now() + Duration::from_secs(30);
        let addr = loop {
            assert!(
                Instant::now() < deadline,
                "serve did not say where it listens"
            );
            let line = lines.next().expect("serve ended before listening").unwrap();
            if let Some(rest) = line.strip_prefix("idemgate listening on http://") {
                break rest.trim().to_string();
            }
        };
        // Keep draining stdout so the server never blocks on it.
        std::thread::spawn(move || for _ in lines {});
        Serve {
            child,
            addr,
            stderr,
            _dir: dir,
        }
    }

    fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> String {
        let mut stream = TcpStream::connect(&self.addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut text = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        for (name, value) in headers {
            text.push_str(&format!("{name}: {value}\r\n"));
        }
        text.push_str("\r\n");
        text.push_str(body);
        stream.write_all(text.as_bytes()).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    }

    /// Stops the server and returns what it logged.
    fn stop(mut self) -> String {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "serve did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
        std::fs::read_to_string(&self.stderr).unwrap()
    }
}

fn sha256_hex(text: &str) -> String {
    // The gateway's own hashing is the reference: `idemgate` has no hashing subcommand here, so
    // use the system's tool, which every CI machine has.
    let out = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().unwrap().write_all(text.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_string()
}

fn header<'a>(answer: &'a str, name: &str) -> Option<&'a str> {
    answer.split("\r\n\r\n").next()?.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
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
    let serve = Serve::start("json");
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
    let serve = Serve::start("text");
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
