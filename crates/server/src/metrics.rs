//! Prometheus metrics: outcomes by tool and status, claim and effect latency histograms, the
//! reconciliation queue's depth, lease takeovers and recoveries.
//!
//! Outcomes are counted by an [`Observer`] (replays and rejections write nothing, so the
//! store cannot see them); latencies, takeovers and recoveries by thin wrappers around the
//! store and each downstream, which see every claim, transition and effect.

use idemgate_core::webhook::{JobMatch, Recorded, WebhookEvent};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use idemgate_core::audit::Entry;
use idemgate_core::effect::{Downstream, EffectOutcome, EffectRequest, JobStatus, Lookup};
use idemgate_core::fingerprint::Fingerprint;
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::Outcome;
use idemgate_core::record::{Event, EventKind, Millis, Record, RecordStatus};
use idemgate_core::store::{
    self, BoxFuture, Cas, Claimed, Due, Filter, Store, SweepReport, Transition, Waiting,
};
use idemgate_engine::Observer;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

pub const OUTCOMES: &str = "idemgate_outcomes_total";
pub const CLAIM_SECONDS: &str = "idemgate_claim_duration_seconds";
pub const EFFECT_SECONDS: &str = "idemgate_effect_duration_seconds";
pub const UNKNOWN_QUEUE: &str = "idemgate_unknown_operations";
pub const TAKEOVERS: &str = "idemgate_lease_takeovers_total";
pub const RECOVERIES: &str = "idemgate_recoveries_total";
pub const BUILD_INFO: &str = "idemgate_build_info";

/// Seconds: from a fast local claim to a slow downstream.
const BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// How often the recorder's histograms fold their raw samples into buckets.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// The process's Prometheus recorder, installed on first use. Metrics are process-wide: several
/// gateways in one process (tests) share them. `None` when another recorder was installed
/// first.
pub fn handle() -> Option<PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new().set_buckets(BUCKETS).ok()?;
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder).ok()?;
            // A histogram keeps its raw samples until they are folded into its buckets, which
            // `/metrics` does when scraped: a gateway nobody scrapes would grow by every
            // request's samples. Fold them every few seconds whatever the scraping.
            // Without the thread (it could not be started) `/metrics` still folds them when
            // scraped: the recorder stays.
            let upkeep = handle.clone();
            let _ = std::thread::Builder::new()
                .name("metrics-upkeep".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(UPKEEP_EVERY);
                        upkeep.run_upkeep();
                    }
                });
            metrics::describe_counter!(OUTCOMES, "Deliveries by tool and outcome status.");
            metrics::describe_histogram!(
                CLAIM_SECONDS,
                metrics::Unit::Seconds,
                "Atomic claim-or-load in the store."
            );
            metrics::describe_histogram!(
                EFFECT_SECONDS,
                metrics::Unit::Seconds,
                "Downstream effect calls, by tool."
            );
            metrics::describe_gauge!(
                UNKNOWN_QUEUE,
                "Operations in `unknown`: the reconciliation queue."
            );
            metrics::describe_counter!(
                TAKEOVERS,
                "Expired leases taken over with compare-and-set."
            );
            metrics::describe_counter!(
                RECOVERIES,
                "Pending records recovered (receipt found or claim taken over)."
            );
            metrics::describe_counter!(
                crate::access::HTTP_REQUESTS,
                "HTTP requests by route, method and status."
            );
            metrics::describe_histogram!(
                crate::access::HTTP_SECONDS,
                metrics::Unit::Seconds,
                "HTTP request latency by route and method."
            );
            metrics::describe_counter!(
                crate::access::OPERATOR_ACTIONS,
                "Operator approvals, denials and reconciliations, by whether they were done."
            );
            metrics::describe_gauge!(BUILD_INFO, "Always 1; the version is a label.");
            metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
            Some(handle)
        })
        .clone()
}

/// Counts every delivery's outcome.
#[derive(Debug, Default)]
pub struct OutcomeCounter;

impl Observer for OutcomeCounter {
    fn delivery(&self, tool: &str, _fingerprint: Option<&Fingerprint>, outcome: &Outcome) {
        metrics::counter!(
            OUTCOMES,
            "tool" => tool.to_string(),
            "status" => outcome.status.as_str(),
            "code" => outcome.error_code().map(|c| c.as_str()).unwrap_or(""),
        )
        .increment(1);
    }
}

/// How often the reconciliation queue is counted: a gauge a scrape every 15 to 60 s reads is
/// at most this much behind.
pub const QUEUE_GAUGE_EVERY: Duration = Duration::from_secs(15);

/// Sets the reconciliation-queue gauge from one count of the store's `unknown` records of
/// `environment` (an index count, however many there are).
pub async fn refresh_unknown_queue(store: &dyn Store, environment: &str) {
    match store.count(environment, RecordStatus::Unknown).await {
        Ok(n) => metrics::gauge!(UNKNOWN_QUEUE).set(n as f64),
        Err(e) => tracing::warn!(error = %e, "could not count the reconciliation queue"),
    }
}

/// The reconciliation queue's gauge, kept by a background task rather than counted on each
/// scrape: a scrape costs the store nothing, however often and however many scrape. The task
/// starts with the first scrape (which waits for its first count, so the gauge is never
/// reported before it was counted) and ends with the gateway's state.
pub struct QueueGauge {
    every: Duration,
    task: tokio::sync::OnceCell<AbortOnDrop>,
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl QueueGauge {
    pub fn new(every: Duration) -> QueueGauge {
        QueueGauge {
            every: every.max(Duration::from_millis(10)),
            task: tokio::sync::OnceCell::new(),
        }
    }

    /// Starts the counting task unless it runs; the first call returns after the first count.
    pub async fn ensure_started(&self, store: Arc<dyn Store>, environment: String) {
        let every = self.every;
        self.task
            .get_or_init(|| async move {
                refresh_unknown_queue(store.as_ref(), &environment).await;
                AbortOnDrop(tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(every).await;
                        refresh_unknown_queue(store.as_ref(), &environment).await;
                    }
                }))
            })
            .await;
    }
}

/// A store that times claims and counts takeovers and recoveries.
pub struct MeteredStore {
    inner: Arc<dyn Store>,
}

impl MeteredStore {
    pub fn new(inner: Arc<dyn Store>) -> MeteredStore {
        MeteredStore { inner }
    }
}

impl Store for MeteredStore {
    fn get<'a>(
        &'a self,
        key: &'a OperationKey,
    ) -> BoxFuture<'a, Result<Option<Record>, store::Error>> {
        self.inner.get(key)
    }
    fn claim(
        &self,
        record: Record,
        events: Vec<Event>,
    ) -> BoxFuture<'_, Result<Claimed, store::Error>> {
        Box::pin(async move {
            let started = Instant::now();
            let answer = self.inner.claim(record, events).await;
            metrics::histogram!(CLAIM_SECONDS).record(started.elapsed().as_secs_f64());
            answer
        })
    }
    fn claim_replaces_read(&self) -> bool {
        self.inner.claim_replaces_read()
    }
    fn claim_unless_duplicate(
        &self,
        record: Record,
        events: Vec<Event>,
        since: Millis,
    ) -> BoxFuture<'_, Result<Claimed, store::Error>> {
        Box::pin(async move {
            let started = Instant::now();
            let answer = self
                .inner
                .claim_unless_duplicate(record, events, since)
                .await;
            metrics::histogram!(CLAIM_SECONDS).record(started.elapsed().as_secs_f64());
            answer
        })
    }
    fn transition(&self, transition: Transition) -> BoxFuture<'_, Result<Cas, store::Error>> {
        Box::pin(async move {
            let takeover = transition.expect.lease_expired_by.is_some();
            let recovered = transition
                .events
                .iter()
                .filter(|e| e.kind == EventKind::Recovered)
                .count();
            let answer = self.inner.transition(transition).await;
            if let Ok(Cas::Done(_)) = &answer {
                if takeover {
                    metrics::counter!(TAKEOVERS).increment(1);
                }
                metrics::counter!(RECOVERIES).increment(recovered as u64);
            }
            answer
        })
    }
    fn audit_log(
        &self,
        after: u64,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<Entry>, store::Error>> {
        self.inner.audit_log(after, limit)
    }
    fn append_events<'a>(
        &'a self,
        key: &'a OperationKey,
        events: Vec<Event>,
    ) -> BoxFuture<'a, Result<(), store::Error>> {
        self.inner.append_events(key, events)
    }
    fn events<'a>(
        &'a self,
        key: &'a OperationKey,
    ) -> BoxFuture<'a, Result<Vec<Event>, store::Error>> {
        self.inner.events(key)
    }
    fn list(&self, filter: Filter) -> BoxFuture<'_, Result<Vec<Record>, store::Error>> {
        self.inner.list(filter)
    }
    fn count<'a>(
        &'a self,
        environment: &'a str,
        status: RecordStatus,
    ) -> BoxFuture<'a, Result<u64, store::Error>> {
        self.inner.count(environment, status)
    }
    fn due(&self, query: Due) -> BoxFuture<'_, Result<Vec<Record>, store::Error>> {
        self.inner.due(query)
    }
    fn waiting(&self, query: Waiting) -> BoxFuture<'_, Result<Vec<Record>, store::Error>> {
        self.inner.waiting(query)
    }
    fn sweep<'a>(
        &'a self,
        environment: &'a str,
        now: Millis,
        limit: usize,
    ) -> BoxFuture<'a, Result<SweepReport, store::Error>> {
        self.inner.sweep(environment, now, limit)
    }
    fn webhook<'a>(
        &'a self,
        source: &'a str,
        event_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<WebhookEvent>, store::Error>> {
        self.inner.webhook(source, event_id)
    }

    fn record_webhook(&self, event: WebhookEvent) -> BoxFuture<'_, Result<Recorded, store::Error>> {
        self.inner.record_webhook(event)
    }

    fn webhooks_for_job<'a>(
        &'a self,
        tenant: &'a str,
        job_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<WebhookEvent>, store::Error>> {
        self.inner.webhooks_for_job(tenant, job_id)
    }

    fn open_jobs<'a>(
        &'a self,
        m: JobMatch<'a>,
    ) -> BoxFuture<'a, Result<Vec<Record>, store::Error>> {
        self.inner.open_jobs(m)
    }

    fn sweep_webhooks(
        &self,
        now: Millis,
        limit: usize,
    ) -> BoxFuture<'_, Result<u64, store::Error>> {
        self.inner.sweep_webhooks(now, limit)
    }
}

/// A downstream whose effect calls are timed, by tool.
pub struct TimedDownstream {
    tool: String,
    inner: Arc<dyn Downstream>,
}

impl TimedDownstream {
    pub fn wrap(tool: &str, inner: Arc<dyn Downstream>) -> Arc<dyn Downstream> {
        Arc::new(TimedDownstream {
            tool: tool.to_string(),
            inner,
        })
    }
}

impl Downstream for TimedDownstream {
    // Passed through: the downstream's own check of the arguments must run before any claim,
    // and a wrapper that fell back to the default would let a record be written first.
    fn check(&self, arguments: &serde_json::Value) -> Result<(), String> {
        self.inner.check(arguments)
    }

    fn perform<'a>(&'a self, request: EffectRequest<'a>) -> BoxFuture<'a, EffectOutcome> {
        Box::pin(async move {
            let started = Instant::now();
            let answer = self.inner.perform(request).await;
            metrics::histogram!(EFFECT_SECONDS, "tool" => self.tool.clone())
                .record(started.elapsed().as_secs_f64());
            answer
        })
    }
    fn lookup_receipt<'a>(&'a self, key: &'a OperationKey) -> BoxFuture<'a, Lookup> {
        self.inner.lookup_receipt(key)
    }
    fn poll_job<'a>(&'a self, key: &'a OperationKey, job_id: &'a str) -> BoxFuture<'a, JobStatus> {
        self.inner.poll_job(key, job_id)
    }
}
