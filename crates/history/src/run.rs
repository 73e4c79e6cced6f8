//! The runner: a fresh PostgreSQL database (or a given store URL), the fake downstream, N real
//! `idemgate serve` processes on that one store, concurrent clients through API v1 and `/mcp`,
//! webhooks from the fake, a nemesis that SIGKILLs and restarts gateways (and restarts the
//! database when allowed), then a settling phase that reads every key's record.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::fake::{Broken, Fake, FakeSettings, Webhooks};
use crate::history::{Entry, Recorder};

pub const TENANT: &str = "h";
pub const ENVIRONMENT: &str = "hist";
const AGENT: &str = "history-agent-token";
const OPERATOR: &str = "history-operator-token";
const WEBHOOK_SECRET_ENV: &str = "IDEMGATE_HISTORY_WEBHOOK_SECRET";
/// 24 bytes, base64: a Standard Webhooks secret for the run's signed events.
const WEBHOOK_SECRET: &str = "whsec_aGlzdG9yeS1jaGVja2VyLXNlY3JldC0wMQ==";
pub const TOOLS: [&str; 4] = ["h.dedup", "h.lookup", "h.joba", "h.jobb"];

#[derive(Clone, Debug, serde::Serialize)]
pub struct Settings {
    pub seed: u64,
    pub duration: Duration,
    pub clients: u32,
    pub gateways: u32,
    /// The `idemgate` binary.
    pub binary: PathBuf,
    /// A store URL to use as it is (the failover's multi-host URL); otherwise a fresh database
    /// is created from `database_url` and dropped afterwards.
    pub store_url: Option<String>,
    #[serde(skip)]
    pub database_url: Option<String>,
    /// Mean time between gateway SIGKILLs; zero: no kills.
    pub kill_every: Duration,
    /// Restart the PostgreSQL cluster (`VERSION NAME`) once, mid-run.
    pub pg_restart: Option<String>,
    /// Share of deliveries through `/mcp` (the rest through API v1).
    pub mcp_share: f64,
    /// Share of repeated deliveries preceded by a malformed one under the same key (API v1:
    /// duplicate member names, an unknown member, not an object, an integer beyond I-JSON).
    pub malformed_share: f64,
    /// The tools whose downstream does not deduplicate on the key (the checker reads it).
    pub non_deduplicating: Vec<String>,
    /// A shell command run once at this offset into the run, recorded as a nemesis action
    /// (`scripts/pg-failover` kills the primary and promotes the standby with it).
    pub exec_at: Option<(Duration, String)>,
    pub webhooks: bool,
    /// Name the job tools in the webhook source (`tools = [...]`, DESIGN §12); `None`: when
    /// the gateway takes the member (a gateway from before it refuses it as unknown).
    pub webhook_tools: Option<bool>,
    pub fake: FakeSettings,
    /// How long the settling phase waits for every key to leave `in_flight`.
    pub settle: Duration,
    pub history: PathBuf,
    /// Where the gateways' configuration and logs go (kept).
    pub workdir: PathBuf,
}

impl Settings {
    pub fn new(seed: u64, binary: PathBuf, history: PathBuf, workdir: PathBuf) -> Settings {
        Settings {
            seed,
            duration: Duration::from_secs(60),
            clients: 8,
            gateways: 2,
            binary,
            store_url: None,
            database_url: std::env::var("DATABASE_URL").ok().filter(|v| !v.is_empty()),
            kill_every: Duration::from_secs(8),
            pg_restart: None,
            mcp_share: 0.3,
            malformed_share: 0.05,
            non_deduplicating: vec!["h.lookup".into()],
            exec_at: None,
            webhooks: true,
            webhook_tools: None,
            fake: FakeSettings {
                seed,
                fault_rate: 0.25,
                hold: Duration::from_millis(1500),
                refuse_rate: 0.05,
                job_fail_rate: 0.15,
                job_max: Duration::from_secs(3),
                overlap_job_ids: None,
                broken: None,
            },
            settle: Duration::from_secs(90),
            history,
            workdir,
        }
    }
}

fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn contract(tool: &str, fake: &str) -> String {
    let path = tool.trim_start_matches("h.");
    let head = format!(
        "name: {tool}\nversion: \"1\"\npurpose: A tool of the history checker's fake downstream.\n\
         use_when: [The history workload calls it.]\ndo_not_use_when: [Anything real.]\n\
         effect_class: key_based\noperation_key:\n  supplied_by: application\n  \
         scope: [tenant, environment, workflow_id, step_id]\n  reused_for_retry: true\n\
         input_schema:\n  type: object\n  properties:\n    item: {{type: string, maxLength: 64}}\n  \
         required: [item]\n  additionalProperties: false\nrequest_fingerprint:\n  fields: [item]\n\
         retention:\n  record_ttl: 1d\n  tombstone_ttl: 2d\n  late_arrival: reject\n  \
         max_retry_window: 1h\nlease_seconds: 3\nowner:\n  reconciliation: history-checker\n  \
         next_review: \"2099-01-01\"\n"
    );
    let downstream = match tool {
        "h.dedup" | "h.lookup" => format!(
            "downstream:\n  deduplicates_by_key: {}\n  receipt_lookup: true\n  receipt: ref\n  \
             http:\n    url: {fake}/t/{path}\n    idempotency_header: Idempotency-Key\n    \
             reference: /ref\n    error_message: /error\n    lookup:\n      \
             url: {fake}/t/{path}/by-key/{{operation_key}}\n    timeouts:\n      connect: 1s\n      total: 1s\n",
            tool == "h.dedup"
        ),
        _ => format!(
            "downstream:\n  deduplicates_by_key: true\n  async_jobs: true\n  receipt: job id, then ref\n  \
             http:\n    url: {fake}/t/{path}\n    idempotency_header: Idempotency-Key\n    \
             reference: /ref\n    result: /report\n    error_message: /error\n    job:\n      \
             id: /job_id\n      poll_url: {fake}/j/{path}/{{job_id}}\n      state: /status\n      \
             done: [done]\n      failed: [failed]\n      reference: /ref\n      result: /report\n      \
             error_message: /error\n    timeouts:\n      connect: 1s\n      total: 1s\n"
        ),
    };
    format!("{head}{downstream}")
}

fn gateway_config(
    settings: &Settings,
    port: u16,
    store: &str,
    contracts: &Path,
    webhook_tools: bool,
) -> String {
    let mut text = format!(
        "listen = \"127.0.0.1:{port}\"\nenvironment = \"{ENVIRONMENT}\"\nstore = \"{store}\"\n\
         contracts = [\"{}/*.yaml\"]\n\n[limits]\nmax_wait_seconds = 5\n\n[recovery]\n\
         interval_seconds = 1\nsweep_interval_seconds = 3600\n\n[[tenants]]\nname = \"{TENANT}\"\n\
         [[tenants.tokens]]\nname = \"agent\"\nsha256 = \"{}\"\nrole = \"agent\"\n\
         [[tenants.tokens]]\nname = \"operator\"\nsha256 = \"{}\"\nrole = \"operator\"\n",
        contracts.display(),
        sha256_hex(AGENT),
        sha256_hex(OPERATOR)
    );
    if settings.webhooks {
        // One source per job tool, as each provider has its own.
        for source in ["joba", "jobb"] {
            text.push_str(&format!(
                "\n[webhooks.{source}]\ntenant = \"{TENANT}\"\nsecret_envs = [\"{WEBHOOK_SECRET_ENV}\"]\n\
                 job_id_pointer = \"/data/job_id\"\noutcome_pointer = \"/type\"\n\
                 success = [\"job.done\"]\nfailure = [\"job.failed\"]\nreference_pointer = \"/data/ref\"\n\
                 result_pointer = \"/data\"\nerror_message_pointer = \"/data/error\"\n"
            ));
            if webhook_tools {
                text.push_str(&format!("tools = [\"h.{source}\"]\n"));
            }
        }
    }
    text
}

fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// One gateway process: its configuration, its log, the child when it runs.
struct Gateway {
    index: u32,
    port: u16,
    config: PathBuf,
    log: PathBuf,
    child: Option<tokio::process::Child>,
}

impl Gateway {
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    async fn start(&mut self, binary: &Path, http: &reqwest::Client) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = tokio::process::Command::new(binary)
            .arg("serve")
            .arg("--config")
            .arg(&self.config)
            .env(WEBHOOK_SECRET_ENV, WEBHOOK_SECRET)
            .env("RUST_LOG", "warn")
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                let tail = std::fs::read_to_string(&self.log).unwrap_or_default();
                let tail: String = tail.lines().rev().take(15).collect::<Vec<_>>().join("\n");
                bail!(
                    "gateway {} exited at start ({status}); its log, last lines first:\n{tail}",
                    self.index
                );
            }
            if let Ok(r) = http.get(format!("{}/healthz", self.url())).send().await
                && r.status().is_success()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "gateway {} not healthy within 60 s (log {})",
                    self.index,
                    self.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Some(pid) = child.id() {
                // SIGKILL: no drain, no goodbye to the database.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
            let _ = child.start_kill();
            std::thread::sleep(Duration::from_millis(50));
            let _ = child.try_wait();
        }
    }

    async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Some(pid) = child.id() {
                unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            }
            if tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .is_err()
            {
                let _ = child.kill().await;
            }
        }
    }
}

/// A database of its own on the server `DATABASE_URL` names, dropped at the end.
struct Database {
    admin: String,
    name: String,
    url: String,
}

fn with_database(url: &str, name: &str) -> anyhow::Result<String> {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let after_scheme = base
        .find("://")
        .map(|i| i + 3)
        .context("DATABASE_URL has no scheme")?;
    let host_end = base[after_scheme..]
        .find('/')
        .map(|i| i + after_scheme)
        .unwrap_or(base.len());
    let mut out = format!("{}/{name}", &base[..host_end]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    Ok(out)
}

async fn admin_client(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .with_context(|| "connecting to DATABASE_URL")?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

impl Database {
    async fn create(admin: &str, seed: u64) -> anyhow::Result<Database> {
        let name = format!("idemgate_history_{}_{seed}", std::process::id());
        let client = admin_client(admin).await?;
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .with_context(|| format!("creating database {name}"))?;
        Ok(Database {
            admin: admin.to_string(),
            url: with_database(admin, &name)?,
            name,
        })
    }

    async fn drop_it(&self) {
        match admin_client(&self.admin).await {
            Ok(client) => {
                if let Err(e) = client
                    .batch_execute(&format!(
                        "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                        self.name
                    ))
                    .await
                {
                    eprintln!("history: could not drop database {}: {e}", self.name);
                }
            }
            Err(e) => eprintln!("history: could not drop database {}: {e}", self.name),
        }
    }
}

/// What one delivery answered.
struct Heard {
    outcome: Option<String>,
    reference: Option<String>,
    safe_to_repeat: Option<bool>,
    code: Option<String>,
    error: Option<String>,
}

impl Heard {
    fn failed(error: String) -> Heard {
        Heard {
            outcome: None,
            reference: None,
            safe_to_repeat: None,
            code: None,
            error: Some(error),
        }
    }

    fn of(body: &Value) -> Heard {
        let text = |v: &Value| v.as_str().map(str::to_string);
        // API v1 bodies name the label `outcome`; the MCP result's structured content
        // (the seed's result shape) names it `status`.
        let outcome = text(&body["outcome"]).or_else(|| text(&body["status"]));
        Heard {
            error: outcome
                .is_none()
                .then(|| format!("no outcome in {}", truncate(&body.to_string()))),
            outcome,
            reference: text(&body["effect_reference"]),
            safe_to_repeat: body["safe_to_repeat"].as_bool(),
            code: text(&body["error"]["code"]),
        }
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(200).collect()
}

fn split_key(key: &str) -> (&str, &str) {
    let mut parts = key.splitn(4, ':').skip(2);
    (parts.next().unwrap_or(""), parts.next().unwrap_or(""))
}

fn arguments(key: &str) -> Value {
    let (workflow, _) = split_key(key);
    json!({"item": workflow})
}

async fn invoke_http(http: &reqwest::Client, gateway: &str, tool: &str, key: &str) -> Heard {
    let (workflow, step) = split_key(key);
    let sent = http
        .post(format!("{gateway}/v1/tools/{tool}/invoke"))
        .bearer_auth(AGENT)
        .header("Idempotency-Key", format!("\"{workflow}:{step}\""))
        .header("Prefer", "wait=2")
        .json(&json!({"arguments": arguments(key)}))
        .send()
        .await;
    let response = match sent {
        Ok(r) => r,
        Err(e) => return Heard::failed(format!("transport: {e}")),
    };
    match response.json::<Value>().await {
        Ok(body) => Heard::of(&body),
        Err(e) => Heard::failed(format!("body: {e}")),
    }
}

/// The malformed bodies: each names the operation in the `Idempotency-Key` header, so the
/// gateway knows the key even though it cannot read the body.
const MALFORMED: [&str; 4] = [
    r#"{"arguments": {"item": "x"}, "arguments": {"item": "x"}}"#,
    r#"{"arguments": {"item": "x"}, "extra": 1}"#,
    r#"[{"arguments": {"item": "x"}}]"#,
    r#"{"arguments": {"item": "x", "n": 9007199254740993}}"#,
];

async fn invoke_malformed(
    http: &reqwest::Client,
    gateway: &str,
    tool: &str,
    key: &str,
    body: &'static str,
) -> Heard {
    let (workflow, step) = split_key(key);
    let sent = http
        .post(format!("{gateway}/v1/tools/{tool}/invoke"))
        .bearer_auth(AGENT)
        .header("Idempotency-Key", format!("\"{workflow}:{step}\""))
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .await;
    match sent {
        Ok(r) => match r.json::<Value>().await {
            Ok(body) => Heard::of(&body),
            Err(e) => Heard::failed(format!("body: {e}")),
        },
        Err(e) => Heard::failed(format!("transport: {e}")),
    }
}

async fn invoke_mcp(
    http: &reqwest::Client,
    gateway: &str,
    tool: &str,
    key: &str,
    id: u64,
) -> Heard {
    let (workflow, step) = split_key(key);
    let message = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": tool.replace('.', "_"),
        "arguments": arguments(key),
        "_meta": {"io.idemgate/operation": {"workflow_id": workflow, "step_id": step}}}});
    let sent = http
        .post(format!("{gateway}/mcp"))
        .bearer_auth(AGENT)
        .header("Accept", "application/json, text/event-stream")
        .json(&message)
        .send()
        .await;
    let response = match sent {
        Ok(r) => r,
        Err(e) => return Heard::failed(format!("transport: {e}")),
    };
    let status = response.status();
    let text = match response.text().await {
        Ok(t) => t,
        Err(e) => return Heard::failed(format!("body: {e}")),
    };
    // A JSON body, or a stream whose `data:` line carries the JSON-RPC answer.
    let json_text = if text.trim_start().starts_with('{') {
        text.clone()
    } else {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
            .rfind(|l| l.starts_with('{'))
            .unwrap_or("")
            .to_string()
    };
    let Ok(body) = serde_json::from_str::<Value>(&json_text) else {
        return Heard::failed(format!("mcp {status}: {}", truncate(&text)));
    };
    let structured = &body["result"]["structuredContent"];
    if structured.is_object() {
        return Heard::of(structured);
    }
    // A refusal before the executor (a problem body at the HTTP level).
    if body["outcome"].is_string() {
        return Heard::of(&body);
    }
    Heard::failed(format!("mcp {status}: {}", truncate(&json_text)))
}

struct World {
    settings: Settings,
    recorder: Recorder,
    http: reqwest::Client,
    urls: Vec<String>,
    keys: Mutex<Vec<String>>,
    /// Keys some delivery has had a settled answer for (a record exists).
    settled: Mutex<std::collections::HashSet<String>>,
    next_key: AtomicU64,
    next_call: AtomicU64,
    stop: AtomicBool,
}

impl World {
    fn new_key(&self, rng: &mut SmallRng) -> (String, String) {
        let n = self.next_key.fetch_add(1, Ordering::Relaxed);
        let tool = TOOLS[rng.random_range(0..TOOLS.len())];
        let key = format!(
            "{TENANT}:{ENVIRONMENT}:{}-s{}-{n}:step",
            tool.trim_start_matches("h."),
            self.settings.seed
        );
        let mut keys = self.keys.lock().unwrap();
        keys.push(key.clone());
        (tool.to_string(), key)
    }

    /// A key some client used lately: concurrent and repeated deliveries of one operation.
    fn old_key(&self, rng: &mut SmallRng) -> Option<(String, String)> {
        let keys = self.keys.lock().unwrap();
        if keys.is_empty() {
            return None;
        }
        let recent = keys.len().min(24);
        let key = keys[keys.len() - 1 - rng.random_range(0..recent)].clone();
        let (workflow, _) = split_key(&key);
        let tool = format!("h.{}", workflow.split('-').next().unwrap_or(""));
        Some((tool, key))
    }
}

async fn client(world: Arc<World>, index: u32) {
    let mut rng = SmallRng::seed_from_u64(world.settings.seed.wrapping_add(1 + index as u64));
    while !world.stop.load(Ordering::Relaxed) {
        let (tool, key, repeat) = match world.old_key(&mut rng) {
            Some((tool, key)) if rng.random_bool(0.45) => (tool, key, true),
            _ => {
                let (tool, key) = world.new_key(&mut rng);
                (tool, key, false)
            }
        };
        // Only for a key with a settled answer: for a key with no record yet, a refusal that
        // says `safe_to_repeat` is true when made, while a delivery of the key still on its way
        // may perform it later — the case docs/history.md discusses, left out of the workload.
        let malformed = repeat
            && rng.random_bool(world.settings.malformed_share.clamp(0.0, 1.0))
            && world.settled.lock().unwrap().contains(&key);
        if malformed {
            let gateway = rng.random_range(0..world.urls.len());
            let body = MALFORMED[rng.random_range(0..MALFORMED.len())];
            let call = world.next_call.fetch_add(1, Ordering::Relaxed);
            world.recorder.record(&Entry::Invoke {
                at: world.recorder.now(),
                call,
                client: index,
                face: "http-malformed".into(),
                gateway: gateway as u32,
                tool: tool.clone(),
                key: key.clone(),
            });
            let heard =
                invoke_malformed(&world.http, &world.urls[gateway], &tool, &key, body).await;
            world.recorder.record(&Entry::Answer {
                at: world.recorder.now(),
                call,
                key: key.clone(),
                outcome: heard.outcome,
                reference: heard.reference,
                safe_to_repeat: heard.safe_to_repeat,
                code: heard.code,
                error: heard.error,
            });
        }
        // One operation, delivered until it has a settled answer (bounded).
        for _ in 0..12 {
            let gateway = rng.random_range(0..world.urls.len());
            let mcp = rng.random_bool(world.settings.mcp_share);
            let call = world.next_call.fetch_add(1, Ordering::Relaxed);
            world.recorder.record(&Entry::Invoke {
                at: world.recorder.now(),
                call,
                client: index,
                face: if mcp { "mcp" } else { "http" }.into(),
                gateway: gateway as u32,
                tool: tool.clone(),
                key: key.clone(),
            });
            let url = &world.urls[gateway];
            let heard = if mcp {
                invoke_mcp(&world.http, url, &tool, &key, call).await
            } else {
                invoke_http(&world.http, url, &tool, &key).await
            };
            let retry_later = heard
                .code
                .as_deref()
                .is_some_and(|c| c.contains("unavailable"));
            world.recorder.record(&Entry::Answer {
                at: world.recorder.now(),
                call,
                key: key.clone(),
                outcome: heard.outcome.clone(),
                reference: heard.reference,
                safe_to_repeat: heard.safe_to_repeat,
                code: heard.code,
                error: heard.error,
            });
            if matches!(
                heard.outcome.as_deref(),
                Some("applied" | "replayed" | "unknown")
            ) || (heard.outcome.as_deref() == Some("rejected") && !retry_later)
            {
                world.settled.lock().unwrap().insert(key.clone());
            }
            match heard.outcome.as_deref() {
                Some("applied" | "replayed" | "unknown") => break,
                // A store outage is a rejection to retry later; other refusals are settled.
                Some("rejected") if !retry_later => break,
                _ => {}
            }
            if world.stop.load(Ordering::Relaxed) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(rng.random_range(100..400))).await;
        }
    }
}

fn pg_ctl(cluster: &str, action: &str) -> bool {
    let mut parts = cluster.split_whitespace();
    let (Some(version), Some(name)) = (parts.next(), parts.next()) else {
        return false;
    };
    std::process::Command::new("pg_ctlcluster")
        .args(["--skip-systemctl-redirect", version, name, action])
        .status()
        .is_ok_and(|s| s.success())
}

async fn nemesis(
    world: Arc<World>,
    gateways: Arc<tokio::sync::Mutex<Vec<Gateway>>>,
) -> anyhow::Result<()> {
    let s = &world.settings;
    let mut rng = SmallRng::seed_from_u64(s.seed ^ 0x6e6d);
    let start = Instant::now();
    let mut restarted_db = false;
    let record = |what: String| {
        eprintln!("history: nemesis: {what}");
        world.recorder.record(&Entry::Nemesis {
            at: world.recorder.now(),
            what,
        });
    };
    while !world.stop.load(Ordering::Relaxed) {
        let pause = if s.kill_every.is_zero() {
            Duration::from_millis(500)
        } else {
            s.kill_every.mul_f64(rng.random_range(0.5..1.5))
        };
        tokio::time::sleep(pause).await;
        if world.stop.load(Ordering::Relaxed) {
            break;
        }
        if let Some(cluster) = &s.pg_restart
            && !restarted_db
            && start.elapsed() > s.duration / 2
        {
            restarted_db = true;
            record(format!("restart PostgreSQL {cluster}"));
            let ok = pg_ctl(cluster, "restart");
            record(format!("PostgreSQL restart done: {ok}"));
        }
        if s.kill_every.is_zero() {
            continue;
        }
        let index = rng.random_range(0..s.gateways) as usize;
        let down = Duration::from_millis(rng.random_range(200..2000));
        {
            let mut gws = gateways.lock().await;
            gws[index].kill();
        }
        record(format!("SIGKILL gateway {index}"));
        tokio::time::sleep(down).await;
        let mut gws = gateways.lock().await;
        gws[index].start(&s.binary, &world.http).await?;
        record(format!("started gateway {index}"));
    }
    Ok(())
}

/// Runs the `exec_at` command at its time, recorded before and after.
async fn exec_at(world: Arc<World>, at: Duration, command: String) {
    tokio::time::sleep(at).await;
    let record = |what: String| {
        eprintln!("history: nemesis: {what}");
        world.recorder.record(&Entry::Nemesis {
            at: world.recorder.now(),
            what,
        });
    };
    record(format!("exec: {command}"));
    let status = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(&command)
        .status()
        .await;
    match status {
        Ok(status) => record(format!("exec done: {status}")),
        Err(e) => record(format!("exec failed to start: {e}")),
    }
}

/// Reads every key's record until none is in flight (or the settle time is up) and records the
/// last read of each.
async fn settle(world: &World) {
    let keys: Vec<String> = world.keys.lock().unwrap().clone();
    let deadline = Instant::now() + world.settings.settle;
    let mut open: Vec<String> = keys;
    let mut round = 0;
    loop {
        let mut still = Vec::new();
        for (i, key) in open.iter().enumerate() {
            let url = &world.urls[i % world.urls.len()];
            let read = world
                .http
                .get(format!("{url}/v1/operations/{key}"))
                .bearer_auth(OPERATOR)
                .send()
                .await;
            let (outcome, reference, error) = match read {
                Ok(r) if r.status() == reqwest::StatusCode::NOT_FOUND => {
                    (None, None, Some("no record".to_string()))
                }
                Ok(r) => match r.json::<Value>().await {
                    Ok(body) => {
                        let heard = Heard::of(&body["outcome"]);
                        (heard.outcome, heard.reference, heard.error)
                    }
                    Err(e) => (None, None, Some(format!("body: {e}"))),
                },
                Err(e) => (None, None, Some(format!("transport: {e}"))),
            };
            let last = Instant::now() > deadline;
            let settled = match outcome.as_deref() {
                Some("in_flight") => false,
                Some(_) => true,
                None => error.as_deref() == Some("no record"),
            };
            if settled || last {
                world.recorder.record(&Entry::Final {
                    at: world.recorder.now(),
                    key: key.clone(),
                    outcome,
                    reference,
                    error,
                });
            } else {
                still.push(key.clone());
            }
        }
        if still.is_empty() || Instant::now() > deadline {
            if !still.is_empty() {
                eprintln!(
                    "history: {} keys still unsettled at the deadline",
                    still.len()
                );
            }
            return;
        }
        round += 1;
        if round % 5 == 0 {
            eprintln!("history: settling, {} keys in flight", still.len());
        }
        open = still;
        tokio::time::sleep(Duration::from_millis(1000)).await;
    }
}

/// Runs the workload and writes the history; the caller checks it.
pub async fn run(settings: Settings) -> anyhow::Result<()> {
    idemgate_downstream_http::install_crypto_provider();
    std::fs::create_dir_all(&settings.workdir)?;
    let recorder = Recorder::create(&settings.history)
        .with_context(|| format!("creating {}", settings.history.display()))?;
    recorder.record(&Entry::Meta {
        seed: settings.seed,
        settings: serde_json::to_value(&settings)?,
    });
    let database = match (&settings.store_url, &settings.database_url) {
        (Some(_), _) => None,
        (None, Some(admin)) => Some(Database::create(admin, settings.seed).await?),
        (None, None) => bail!(
            "no PostgreSQL: set DATABASE_URL (a database is created and dropped), or pass --store-url"
        ),
    };
    let store = settings
        .store_url
        .clone()
        .or_else(|| database.as_ref().map(|d| d.url.clone()))
        .expect("a store");
    let outcome = run_on(&settings, &recorder, &store).await;
    recorder.flush();
    if let Some(db) = database {
        db.drop_it().await;
    }
    outcome
}

async fn run_on(settings: &Settings, recorder: &Recorder, store: &str) -> anyhow::Result<()> {
    let fake = Fake::start(settings.fake.clone(), recorder.clone()).await?;
    let contracts = settings.workdir.join("contracts");
    std::fs::create_dir_all(&contracts)?;
    for tool in TOOLS {
        std::fs::write(
            contracts.join(format!("{tool}.yaml")),
            contract(tool, &fake.url()),
        )?;
    }
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .pool_max_idle_per_host(0)
        .build()?;
    let mut gateways = Vec::new();
    let mut webhook_tools = settings.webhook_tools.unwrap_or(true);
    for index in 0..settings.gateways {
        let port = free_port()?;
        let config = settings.workdir.join(format!("gateway{index}.toml"));
        let write = |tools: bool| {
            std::fs::write(
                &config,
                gateway_config(settings, port, store, &contracts, tools),
            )
        };
        write(webhook_tools)?;
        let mut gateway = Gateway {
            index,
            port,
            config: config.clone(),
            log: settings.workdir.join(format!("gateway{index}.log")),
            child: None,
        };
        match gateway.start(&settings.binary, &http).await {
            Ok(()) => {}
            // A gateway from before webhook sources named their tools refuses the member.
            Err(e)
                if settings.webhook_tools.is_none()
                    && webhook_tools
                    && settings.webhooks
                    && e.to_string().contains("tools") =>
            {
                eprintln!(
                    "history: this gateway does not take `tools` in a webhook source; \
                     running without it, and with distinct job ids"
                );
                webhook_tools = false;
                write(false)?;
                gateway.start(&settings.binary, &http).await?;
            }
            Err(e) => return Err(e),
        }
        gateways.push(gateway);
    }
    // Overlapping job ids are the case webhook sources bound to their tools exist for; a
    // gateway without that binding settles one tool's operation with another's event.
    let overlap = settings
        .fake
        .overlap_job_ids
        .unwrap_or(webhook_tools || !settings.webhooks);
    fake.overlap_job_ids(overlap);
    recorder.record(&Entry::Nemesis {
        at: recorder.now(),
        what: format!(
            "setup: webhook source names its tools: {webhook_tools}; overlapping job ids: {overlap}"
        ),
    });
    let urls: Vec<String> = gateways.iter().map(Gateway::url).collect();
    if settings.webhooks {
        fake.send_webhooks(Webhooks {
            gateways: urls.clone(),
            secret: WEBHOOK_SECRET.into(),
        });
    }
    let world = Arc::new(World {
        settings: settings.clone(),
        recorder: recorder.clone(),
        http,
        urls,
        keys: Mutex::new(Vec::new()),
        settled: Mutex::new(std::collections::HashSet::new()),
        next_key: AtomicU64::new(0),
        next_call: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    });
    let gateways = Arc::new(tokio::sync::Mutex::new(gateways));
    eprintln!(
        "history: seed {} — {} clients, {} gateways, {} s; history {}; gateway logs in {}",
        settings.seed,
        settings.clients,
        settings.gateways,
        settings.duration.as_secs(),
        settings.history.display(),
        settings.workdir.display()
    );
    let clients: Vec<_> = (0..settings.clients)
        .map(|i| tokio::spawn(client(world.clone(), i)))
        .collect();
    let chaos = tokio::spawn(nemesis(world.clone(), gateways.clone()));
    let exec = settings
        .exec_at
        .clone()
        .map(|(at, command)| tokio::spawn(exec_at(world.clone(), at, command)));
    tokio::time::sleep(settings.duration).await;
    if let Some(exec) = exec {
        let _ = exec.await;
    }
    world.stop.store(true, Ordering::Relaxed);
    let nemesis_result = chaos.await;
    for c in clients {
        let _ = tokio::time::timeout(Duration::from_secs(60), c).await;
    }
    // Every gateway up for the settling phase (the nemesis may have stopped mid-kill).
    {
        let mut gws = gateways.lock().await;
        for g in gws.iter_mut() {
            if g.child.is_none() {
                g.start(&settings.binary, &world.http).await?;
            }
        }
    }
    match nemesis_result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => bail!("the nemesis failed: {e:#}"),
        Err(e) => bail!("the nemesis panicked: {e}"),
    }
    settle(&world).await;
    let mut gws = gateways.lock().await;
    for g in gws.iter_mut() {
        g.stop().await;
    }
    eprintln!(
        "history: {} keys, {} effects at the fake",
        world.keys.lock().unwrap().len(),
        fake.effects()
    );
    Ok(())
}

/// The `idemgate` binary of this workspace: `IDEMGATE_BIN`, else `CARGO_TARGET_DIR` (or
/// `target`)/debug/idemgate.
pub fn find_binary() -> anyhow::Result<PathBuf> {
    if let Some(bin) = std::env::var_os("IDEMGATE_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let bin = target.join("debug/idemgate");
    if !bin.is_file() {
        bail!(
            "no idemgate binary at {}: build it (cargo build -p idemgate-cli) or set IDEMGATE_BIN",
            bin.display()
        );
    }
    Ok(bin)
}

pub fn broken_from(name: &str) -> anyhow::Result<Broken> {
    match name {
        "apply-twice" => Ok(Broken::ApplyTwice),
        "refuse-after-commit" => Ok(Broken::RefuseAfterCommit),
        other => bail!("--broken takes apply-twice or refuse-after-commit, not {other:?}"),
    }
}
