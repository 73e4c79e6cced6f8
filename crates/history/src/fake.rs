//! The fake downstream: one HTTP server on 127.0.0.1 playing four systems of record, recording
//! every perform request that reaches it (`arrival`) and every effect it performs (`effect`)
//! in the history, and injecting faults decided by its own seeded generator.
//!
//! | tool | path | what it is |
//! |---|---|---|
//! | `h.dedup` | `POST /t/dedup` | deduplicates on `Idempotency-Key`; receipt lookup by key |
//! | `h.lookup` | `POST /t/lookup` | does **not** deduplicate (a resend is a second effect); receipt lookup by key |
//! | `h.joba`, `h.jobb` | `POST /t/joba`, `/t/jobb` | deduplicating job submission (202 + job id), polled at `/j/<tool>/<job id>`; slow and failing jobs; signed webhooks on completion |
//!
//! Faults per perform request: `lost` (performed, answered after the gateway's timeout),
//! `error` (performed, answered 500), `timeout` (not performed, answered after the gateway's
//! timeout), `busy` (not performed, 503 at once); per key: `refuse` (422, never performed), and
//! for jobs, failing (the job ends `failed`) and slow (runs for up to `job_max_ms`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::history::{Entry, Recorder};

/// A defect the fake is built with on purpose, for the checker's self-test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Broken {
    /// `h.dedup` and `h.lookup` perform every fourth effect twice (a downstream's own retry
    /// that does not deduplicate): `duplicate_effect`.
    ApplyTwice,
    /// A fifth of the requests `h.dedup` and `h.lookup` would perform without a fault are
    /// performed and then answered 422, a refusal that lies: the gateway honestly says
    /// `safe_to_repeat`, and the checker sees the effect (`unsafe_repeat`). Counted per tool —
    /// its first such request, then every fifth — not drawn at random: a ten-second run sends
    /// `h.lookup` about a dozen, and a draw of a fifth missed them all in one run of twelve
    /// (0.8^11), failing the self-test on an honest gateway.
    RefuseAfterCommit,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct FakeSettings {
    pub seed: u64,
    /// Share (0 to 1) of perform requests that get a fault.
    pub fault_rate: f64,
    /// How long a `lost` or `timeout` answer is held: longer than the contracts' timeout.
    pub hold: Duration,
    /// Share of keys the downstream refuses (422).
    pub refuse_rate: f64,
    /// Share of jobs that end `failed`.
    pub job_fail_rate: f64,
    /// Longest a job runs.
    pub job_max: Duration,
    /// Job ids count up from 1 per tool, so the two job tools hand out the same ids; `None`:
    /// decided when the gateways start (`Fake::overlap_job_ids`).
    pub overlap_job_ids: Option<bool>,
    pub broken: Option<Broken>,
}

/// Where the fake sends its signed webhook events.
#[derive(Clone)]
pub struct Webhooks {
    pub gateways: Vec<String>,
    pub secret: String,
}

struct Job {
    reference: String,
    fails: bool,
    done_at: Instant,
}

#[derive(Default)]
struct Books {
    /// (tool, key) → references performed, in order.
    effects: HashMap<(String, String), Vec<String>>,
    /// (tool, key) → job id.
    job_of: HashMap<(String, String), String>,
    /// (tool, job id) → job.
    jobs: HashMap<(String, String), Job>,
    next_job: HashMap<String, u64>,
    next_ref: u64,
    events: u64,
    /// tool → requests `Broken::RefuseAfterCommit` could have lied to so far.
    liable: HashMap<String, u64>,
}

struct Inner {
    settings: FakeSettings,
    recorder: Recorder,
    books: Mutex<Books>,
    rng: Mutex<SmallRng>,
    webhooks: Mutex<Option<Webhooks>>,
    overlap: std::sync::atomic::AtomicBool,
    client: reqwest::Client,
}

/// The running fake.
#[derive(Clone)]
pub struct Fake {
    inner: Arc<Inner>,
    pub addr: std::net::SocketAddr,
}

/// A stable per-key draw in [0, 1): the same key always gets the same verdict, so a resend of
/// a refused key is refused again and a failing job fails whichever delivery started it.
fn per_key(seed: u64, key: &str, salt: &str) -> f64 {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("{seed}:{salt}:{key}").as_bytes());
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    (u64::from_be_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64
}

impl Fake {
    pub async fn start(settings: FakeSettings, recorder: Recorder) -> anyhow::Result<Fake> {
        idemgate_downstream_http::install_crypto_provider();
        let inner = Arc::new(Inner {
            rng: Mutex::new(SmallRng::seed_from_u64(settings.seed ^ 0xfa6e)),
            recorder,
            books: Mutex::new(Books::default()),
            webhooks: Mutex::new(None),
            overlap: std::sync::atomic::AtomicBool::new(settings.overlap_job_ids == Some(true)),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()?,
            settings,
        });
        let app = Router::new()
            .route("/t/{tool}", post(perform))
            .route("/t/{tool}/by-key/{key}", get(lookup))
            .route("/j/{tool}/{job}", get(poll))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Fake { inner, addr })
    }

    /// Whether the two job tools hand out the same job ids (set before the workload starts).
    pub fn overlap_job_ids(&self, overlap: bool) {
        self.inner
            .overlap
            .store(overlap, std::sync::atomic::Ordering::Relaxed);
    }

    /// Turns on webhook events for finished jobs (once the gateways' addresses are known).
    pub fn send_webhooks(&self, webhooks: Webhooks) {
        *self.inner.webhooks.lock().unwrap() = Some(webhooks);
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Effects performed so far (all tools).
    pub fn effects(&self) -> usize {
        self.inner
            .books
            .lock()
            .unwrap()
            .effects
            .values()
            .map(Vec::len)
            .sum()
    }
}

fn tool_name(path_tool: &str) -> Option<&'static str> {
    match path_tool {
        "dedup" => Some("h.dedup"),
        "lookup" => Some("h.lookup"),
        "joba" => Some("h.joba"),
        "jobb" => Some("h.jobb"),
        _ => None,
    }
}

fn answer(status: StatusCode, body: Value) -> Response {
    (status, axum::Json(body)).into_response()
}

async fn perform(
    State(inner): State<Arc<Inner>>,
    Path(path_tool): Path<String>,
    headers: HeaderMap,
) -> Response {
    let Some(tool) = tool_name(&path_tool) else {
        return answer(StatusCode::NOT_FOUND, json!({"error": "no such tool"}));
    };
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
    else {
        return answer(
            StatusCode::BAD_REQUEST,
            json!({"error": "no Idempotency-Key header"}),
        );
    };
    let s = &inner.settings;
    let refused = per_key(s.seed, &key, "refuse") < s.refuse_rate;
    let fault = if refused {
        "refuse"
    } else {
        let mut rng = inner.rng.lock().unwrap();
        if rng.random_bool(s.fault_rate.clamp(0.0, 1.0)) {
            ["lost", "lost", "error", "timeout", "busy"][rng.random_range(0..5)]
        } else {
            "none"
        }
    };
    inner.recorder.record(&Entry::Arrival {
        at: inner.recorder.now(),
        tool: tool.into(),
        key: key.clone(),
        fault: fault.into(),
    });
    match fault {
        "refuse" => {
            return answer(
                StatusCode::UNPROCESSABLE_ENTITY,
                json!({"error": "the fake refuses this key"}),
            );
        }
        "busy" => {
            return answer(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": "busy, nothing done"}),
            );
        }
        "timeout" => {
            tokio::time::sleep(s.hold).await;
            return answer(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": "timed out, nothing done"}),
            );
        }
        _ => {}
    }
    let (status, body) = apply(&inner, tool, &key);
    let lie = s.broken == Some(Broken::RefuseAfterCommit)
        && fault == "none"
        && (tool == "h.dedup" || tool == "h.lookup")
        && {
            let mut books = inner.books.lock().unwrap();
            let seen = books.liable.entry(tool.to_string()).or_default();
            *seen += 1;
            *seen % 5 == 1
        };
    if lie {
        return answer(
            StatusCode::UNPROCESSABLE_ENTITY,
            json!({"error": "refused (but performed: the broken fake)"}),
        );
    }
    match fault {
        "lost" => tokio::time::sleep(s.hold).await,
        "error" => {
            return answer(
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"error": "failed after committing"}),
            );
        }
        _ => {}
    }
    answer(status, body)
}

/// Performs the effect (or finds the one a deduplicating tool already performed).
fn apply(inner: &Arc<Inner>, tool: &str, key: &str) -> (StatusCode, Value) {
    let s = &inner.settings;
    let mut books = inner.books.lock().unwrap();
    let id = (tool.to_string(), key.to_string());
    let job_tool = tool == "h.joba" || tool == "h.jobb";
    if job_tool {
        if let Some(job) = books.job_of.get(&id) {
            return (StatusCode::ACCEPTED, json!({"job_id": job}));
        }
        let n = {
            let counter = books
                .next_job
                .entry(
                    if inner.overlap.load(std::sync::atomic::Ordering::Relaxed) {
                        tool
                    } else {
                        "all"
                    }
                    .to_string(),
                )
                .or_insert(0);
            *counter += 1;
            *counter
        };
        let job_id = format!("job_{n}");
        books.next_ref += 1;
        let reference = format!("{}-{}", tool.trim_start_matches("h."), books.next_ref);
        let fails = per_key(s.seed, key, "job-fails") < s.job_fail_rate;
        let runs = s.job_max.mul_f64(per_key(s.seed, key, "job-duration"));
        books.job_of.insert(id.clone(), job_id.clone());
        books.jobs.insert(
            (tool.to_string(), job_id.clone()),
            Job {
                reference: reference.clone(),
                fails,
                done_at: Instant::now() + runs,
            },
        );
        if !fails {
            books.effects.entry(id).or_default().push(reference.clone());
            inner.recorder.record(&Entry::Effect {
                at: inner.recorder.now(),
                tool: tool.into(),
                key: key.into(),
                reference: reference.clone(),
            });
        }
        drop(books);
        spawn_webhook(inner.clone(), tool.to_string(), job_id.clone(), runs);
        return (StatusCode::ACCEPTED, json!({"job_id": job_id}));
    }
    if tool == "h.dedup"
        && let Some(first) = books.effects.get(&id).and_then(|v| v.first())
    {
        return (StatusCode::OK, json!({"ref": first}));
    }
    books.next_ref += 1;
    let reference = format!("{}-{}", tool.trim_start_matches("h."), books.next_ref);
    let times = if s.broken == Some(Broken::ApplyTwice) && books.next_ref.is_multiple_of(4) {
        2
    } else {
        1
    };
    for n in 0..times {
        let performed = if n == 0 {
            reference.clone()
        } else {
            format!("{reference}-twice")
        };
        books
            .effects
            .entry(id.clone())
            .or_default()
            .push(performed.clone());
        inner.recorder.record(&Entry::Effect {
            at: inner.recorder.now(),
            tool: tool.into(),
            key: key.into(),
            reference: performed,
        });
    }
    (StatusCode::CREATED, json!({"ref": reference}))
}

async fn lookup(
    State(inner): State<Arc<Inner>>,
    Path((path_tool, key)): Path<(String, String)>,
) -> Response {
    let Some(tool) = tool_name(&path_tool) else {
        return answer(StatusCode::NOT_FOUND, json!({"error": "no such tool"}));
    };
    let books = inner.books.lock().unwrap();
    match books
        .effects
        .get(&(tool.to_string(), key))
        .and_then(|v| v.first())
    {
        Some(reference) => answer(StatusCode::OK, json!({"ref": reference})),
        None => answer(StatusCode::NOT_FOUND, json!({"error": "no receipt"})),
    }
}

fn job_state(job: &Job) -> Value {
    if Instant::now() < job.done_at {
        json!({"status": "running"})
    } else if job.fails {
        json!({"status": "failed", "error": "the fake's job failed"})
    } else {
        json!({"status": "done", "ref": job.reference, "report": {"ref": job.reference}})
    }
}

async fn poll(
    State(inner): State<Arc<Inner>>,
    Path((path_tool, job_id)): Path<(String, String)>,
) -> Response {
    let Some(tool) = tool_name(&path_tool) else {
        return answer(StatusCode::NOT_FOUND, json!({"error": "no such tool"}));
    };
    let books = inner.books.lock().unwrap();
    match books.jobs.get(&(tool.to_string(), job_id)) {
        Some(job) => answer(StatusCode::OK, job_state(job)),
        None => answer(StatusCode::NOT_FOUND, json!({"error": "no such job"})),
    }
}

/// When the job ends, its outcome is sent as a signed event to one of the gateways (sometimes
/// twice, to another one). Some events are sent at once, racing the 202 that names the job.
fn spawn_webhook(inner: Arc<Inner>, tool: String, job_id: String, runs: Duration) {
    let Some(webhooks) = inner.webhooks.lock().unwrap().clone() else {
        return;
    };
    let (first, twice) = {
        let mut rng = inner.rng.lock().unwrap();
        (
            rng.random_range(0..webhooks.gateways.len()),
            rng.random_bool(0.3),
        )
    };
    tokio::spawn(async move {
        tokio::time::sleep(runs).await;
        let (body, event) = {
            let mut books = inner.books.lock().unwrap();
            let Some(job) = books.jobs.get(&(tool.clone(), job_id.clone())) else {
                return;
            };
            let state = job_state(job);
            let kind = if job.fails { "job.failed" } else { "job.done" };
            let mut data = json!({"job_id": job_id});
            if job.fails {
                data["error"] = json!("the fake's job failed");
            } else {
                data["ref"] = state["ref"].clone();
            }
            books.events += 1;
            (
                json!({"type": kind, "data": data}).to_string(),
                format!("evt_{}", books.events),
            )
        };
        let Ok(signer) = standardwebhooks::Webhook::new(&webhooks.secret) else {
            return;
        };
        let sends = if twice { 2 } else { 1 };
        for i in 0..sends {
            let at = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0);
            let Ok(signature) = signer.sign(&event, at, body.as_bytes()) else {
                return;
            };
            let gateway = &webhooks.gateways[(first + i) % webhooks.gateways.len()];
            // A gateway that is down misses the event; polling still finds the job's end.
            let _ = inner
                .client
                // One source per job tool, named after it (`joba`, `jobb`).
                .post(format!(
                    "{gateway}/v1/webhooks/{}",
                    tool.trim_start_matches("h.")
                ))
                .header("webhook-id", &event)
                .header("webhook-timestamp", at.to_string())
                .header("webhook-signature", signature)
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await;
        }
    });
}
