//! `idemgate serve` as a child process, and a small HTTP/1.1 server for the other side of the
//! wire (a fake downstream, a trace collector), for tests that look at what the process does.

#![allow(dead_code)] // Each test file uses part of it.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running `idemgate serve`.
pub struct Serve {
    child: Child,
    pub addr: String,
    stderr: PathBuf,
}

impl Serve {
    /// Starts `idemgate serve --config <dir>/gate.toml` with `config` and these extra
    /// arguments and environment, and waits until it says where it listens.
    pub fn start(dir: &Path, config: &str, args: &[&str], env: &[(&str, &str)]) -> Serve {
        let config_path = dir.join("gate.toml");
        std::fs::write(&config_path, config).unwrap();
        let stderr = dir.join("stderr.log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_idemgate"));
        cmd.arg("serve")
            .args(args)
            .arg("--config")
            .arg(&config_path)
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let deadline = Instant::now() + Duration::from_secs(30);
        let addr = loop {
            assert!(
                Instant::now() < deadline,
                "serve did not say where it listens"
            );
            let line = match lines.next() {
                Some(line) => line.unwrap(),
                None => panic!(
                    "serve ended before listening: {}",
                    std::fs::read_to_string(&stderr).unwrap_or_default()
                ),
            };
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
        }
    }

    /// One request over a fresh connection; the whole answer, head and body.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> String {
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

    /// Stops the server with SIGTERM and returns what it logged.
    pub fn stop(mut self) -> String {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "serve did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
        std::fs::read_to_string(&self.stderr).unwrap()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A header of an answer `Serve::request` returned.
pub fn header<'a>(answer: &'a str, name: &str) -> Option<&'a str> {
    answer.split("\r\n\r\n").next()?.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// A request an [`HttpServer`] received.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    /// Lower-case names.
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

/// A loopback HTTP/1.1 server answering every request with `answer`, keeping what it received.
/// Serves keep-alive connections; each connection on a thread of its own.
pub struct HttpServer {
    pub addr: String,
    received: Arc<Mutex<Vec<Received>>>,
}

impl HttpServer {
    pub fn start(answer: fn(&Received) -> (u16, String)) -> HttpServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let received = Arc::new(Mutex::new(Vec::new()));
        let kept = received.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let kept = kept.clone();
                std::thread::spawn(move || connection(stream, answer, &kept));
            }
        });
        HttpServer { addr, received }
    }

    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

fn connection(
    stream: TcpStream,
    answer: fn(&Received) -> (u16, String),
    kept: &Mutex<Vec<Received>>,
) {
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    // Bounded: a test's peer sends a handful of requests per connection.
    for _ in 0..10_000 {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let (Some(method), Some(path)) = (parts.next(), parts.next()) else {
            return;
        };
        let (method, path) = (method.to_string(), path.to_string());
        let mut headers = HashMap::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((n, v)) = h.split_once(':') {
                headers.insert(n.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
        let length = headers
            .get("content-length")
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let request = Received {
            method,
            path,
            headers,
            body,
        };
        let (status, text) = answer(&request);
        kept.lock().unwrap().push(request);
        let head = format!(
            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            text.len()
        );
        if writer.write_all(head.as_bytes()).is_err() || writer.write_all(text.as_bytes()).is_err()
        {
            return;
        }
    }
}
