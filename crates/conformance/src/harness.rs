//! The scenario harness: one store (wrapped in a [`FaultyStore`]), one [`FakeDownstream`], one
//! manual clock, a switchable authorization hook, and executors that share them.

use std::sync::{Arc, Mutex};

use idemgate_core::clock::{Clock, ManualClock};
use idemgate_core::contract::Contract;
use idemgate_core::effect::{
    AuthRequest, Authorization, Authorizer, Downstream, EffectOutcome, EffectRequest, JobStatus,
    Lookup,
};
use idemgate_core::fingerprint::Fingerprint;
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::{Outcome, Status};
use idemgate_core::record::{EventKind, Receipt, Record};
use idemgate_core::store::{BoxFuture, Store};
use idemgate_engine::{Caller, Executor, Observer, Operation, Settings};
use serde_json::{Value, json};

use crate::downstream::FakeDownstream;
use crate::faulty::FaultyStore;

/// 2026-01-01T00:00:00Z: scenarios start at a fixed instant so runs are repeatable.
pub const EPOCH: i64 = 1_767_225_600_000;

/// A fresh store for one scenario, and whatever must live as long as it (a temporary
/// directory, a throwaway database).
pub struct Fixture {
    pub store: Arc<dyn Store>,
    pub guard: Box<dyn std::any::Any + Send>,
}

/// An authorization hook a test can flip between allow, deny and unreachable.
#[derive(Debug)]
pub struct Switch {
    answer: Mutex<Authorization>,
    asked: Mutex<Vec<String>>,
    /// Says it asks nothing while it allows everything (see [`Switch::quiet_while_allowing`]).
    quiet: std::sync::atomic::AtomicBool,
}

impl Default for Switch {
    fn default() -> Self {
        Switch {
            answer: Mutex::new(Authorization::Allowed),
            asked: Mutex::new(Vec::new()),
            quiet: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl Switch {
    pub fn set(&self, answer: Authorization) {
        *self.answer.lock().unwrap() = answer;
    }
    /// While on and allowing, the switch tells the executor that a decision asks nothing
    /// ([`Authorizer::asks`] false), as a gateway without a hook does: the executor may then
    /// claim a key before reading it, where the store offers that. Set to a denial or an
    /// outage, it asks again.
    pub fn quiet_while_allowing(&self, on: bool) {
        self.quiet.store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// How many times the hook was asked.
    pub fn asked(&self) -> usize {
        self.asked.lock().unwrap().len()
    }
}

impl Authorizer for Switch {
    fn authorize<'a>(&'a self, request: AuthRequest<'a>) -> BoxFuture<'a, Authorization> {
        self.asked
            .lock()
            .unwrap()
            .push(format!("{:?} {}", request.stage, request.tool));
        let answer = self.answer.lock().unwrap().clone();
        Box::pin(std::future::ready(answer))
    }

    fn asks(&self, _tool: &str) -> bool {
        !(self.quiet.load(std::sync::atomic::Ordering::SeqCst)
            && *self.answer.lock().unwrap() == Authorization::Allowed)
    }
}

/// Sees every delivery: the "two request traces" of a replay are counted here, because a
/// replay writes nothing to the store.
#[derive(Debug, Default)]
pub struct Recorder {
    seen: Mutex<Vec<(Option<String>, Status)>>,
}

impl Recorder {
    pub fn deliveries(&self) -> Vec<(Option<String>, Status)> {
        self.seen.lock().unwrap().clone()
    }
    pub fn count(&self, key: &OperationKey) -> usize {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, _)| k.as_deref() == Some(key.as_str()))
            .count()
    }
}

impl Observer for Recorder {
    fn delivery(&self, _tool: &str, _fp: Option<&Fingerprint>, outcome: &Outcome) {
        self.seen.lock().unwrap().push((
            outcome.operation_key.as_ref().map(|k| k.to_string()),
            outcome.status,
        ));
    }
}

/// How a scenario's contract is written.
#[derive(Debug, Clone)]
pub struct Spec {
    pub class: &'static str,
    pub version: &'static str,
    pub deduplicates: bool,
    pub receipt_lookup: bool,
    pub async_jobs: bool,
    pub approval: &'static str,
    pub late_arrival: &'static str,
    pub duplicate_intent_window: Option<&'static str>,
    pub lease_seconds: u64,
}

impl Spec {
    /// A key-based tool whose downstream deduplicates on the key and offers a receipt lookup.
    pub fn key_based() -> Spec {
        Spec {
            class: "key_based",
            version: "2026-08-18",
            deduplicates: true,
            receipt_lookup: true,
            async_jobs: false,
            approval: "never",
            late_arrival: "reject",
            duplicate_intent_window: None,
            lease_seconds: 30,
        }
    }
    pub fn dedup(mut self, on: bool) -> Spec {
        self.deduplicates = on;
        self
    }
    pub fn lookup(mut self, on: bool) -> Spec {
        self.receipt_lookup = on;
        self
    }
    pub fn jobs(mut self) -> Spec {
        self.async_jobs = true;
        self
    }
    pub fn class(mut self, class: &'static str) -> Spec {
        self.class = class;
        self
    }
    pub fn approval(mut self, rule: &'static str) -> Spec {
        self.approval = rule;
        self
    }
    pub fn late_arrival(mut self, policy: &'static str) -> Spec {
        self.late_arrival = policy;
        self
    }
    pub fn version(mut self, version: &'static str) -> Spec {
        self.version = version;
        self
    }
    pub fn window(mut self, window: &'static str) -> Spec {
        self.duplicate_intent_window = Some(window);
        self
    }

    pub fn yaml(&self) -> String {
        let material = if self.class == "read" {
            "[]".to_string()
        } else {
            "[queue_id, subject, body]".to_string()
        };
        let precondition = if self.class == "natural_idempotent" {
            "\n  version_precondition: expected_version"
        } else {
            ""
        };
        let window = self
            .duplicate_intent_window
            .map(|w| format!("duplicate_intent_window: {w}\n"))
            .unwrap_or_default();
        format!(
            r#"name: tickets.create
version: "{version}"
purpose: Create one support ticket for one workflow step.
use_when: [The workflow has a validated customer and a new issue to record.]
do_not_use_when: [The agent is checking whether a ticket exists.]
effect_class: {class}
operation_key:
  supplied_by: application
  scope: [tenant, environment, workflow_id, step_id]
input_schema:
  type: object
  required: [subject]
  additionalProperties: false
  properties:
    queue_id: {{type: string}}
    subject: {{type: string, minLength: 1}}
    body: {{type: string}}
    trace_id: {{type: string}}
    expected_version: {{type: integer}}
request_fingerprint:
  fields: {material}
  defaults: {defaults}
  normalize: {normalize}
downstream:
  deduplicates_by_key: {dedup}
  receipt_lookup: {lookup}
  async_jobs: {jobs}{precondition}
security:
  approval: {approval}
retention:
  record_ttl: 1h
  tombstone_ttl: 1d
  late_arrival: {late}
  max_retry_window: 1h
lease_seconds: {lease}
{window}owner:
  reconciliation: support-operations
"#,
            version = self.version,
            class = self.class,
            material = material,
            defaults = if self.class == "read" {
                "{}"
            } else {
                "{queue_id: support}"
            },
            normalize = if self.class == "read" {
                "{}"
            } else {
                "{subject: [trim]}"
            },
            dedup = self.deduplicates,
            lookup = self.receipt_lookup,
            jobs = self.async_jobs,
            precondition = precondition,
            approval = self.approval,
            late = self.late_arrival,
            lease = self.lease_seconds,
            window = window,
        )
    }

    pub fn contract(&self) -> Arc<Contract> {
        Arc::new(
            Contract::load(&self.yaml(), "scenario.yaml")
                .unwrap_or_else(|e| panic!("scenario contract does not load: {e}")),
        )
    }
}

/// The arguments most scenarios send.
pub fn ticket(subject: &str) -> Value {
    json!({ "queue_id": "support", "subject": subject, "body": "Customer asks for a refund." })
}

pub struct Harness {
    pub store: Arc<FaultyStore<Arc<dyn Store>>>,
    pub downstream: FakeDownstream,
    pub clock: Arc<ManualClock>,
    pub auth: Arc<Switch>,
    pub recorder: Arc<Recorder>,
    pub executor: Executor,
}

impl Harness {
    /// A harness over `store`, with a downstream that deduplicates and offers receipt lookup
    /// (scenarios switch either off to match their contract).
    /// On a store that claims a key before reading it ([`Store::claim_replaces_read`]:
    /// PostgreSQL) the hook is quiet while it allows, so that the executor takes that path,
    /// as a gateway without a hook does; wrap the store with [`FaultyStore::read_first`] for
    /// the other path.
    pub fn new(store: Arc<dyn Store>) -> Harness {
        let claim_first = store.claim_replaces_read();
        let store = Arc::new(FaultyStore::new(store));
        let downstream = FakeDownstream::new()
            .deduplicating(true)
            .with_receipt_lookup(true);
        let clock = Arc::new(ManualClock::new(EPOCH));
        let auth = Arc::new(Switch::default());
        auth.quiet_while_allowing(claim_first);
        let recorder = Arc::new(Recorder::default());
        let executor = Executor::new(
            store.clone(),
            clock.clone(),
            auth.clone(),
            Settings {
                worker: "worker-a".into(),
                ..Settings::default()
            },
        )
        .with_observer(recorder.clone());
        Harness {
            store,
            downstream,
            clock,
            auth,
            recorder,
            executor,
        }
    }

    /// Matches the fake downstream's knobs to a contract.
    pub fn for_spec(store: Arc<dyn Store>, spec: &Spec) -> Harness {
        let h = Harness::new(store);
        h.downstream.set_deduplicates(spec.deduplicates);
        h.downstream.set_receipt_lookup(spec.receipt_lookup);
        h
    }

    /// Another worker process on the same store, clock and downstream.
    pub fn worker(&self, name: &str) -> Executor {
        Executor::new(
            self.store.clone(),
            self.clock.clone(),
            self.auth.clone(),
            Settings {
                worker: name.into(),
                ..Settings::default()
            },
        )
        .with_observer(self.recorder.clone())
    }

    pub fn now(&self) -> i64 {
        self.clock.now()
    }

    /// Moves time past any lease taken so far.
    pub fn expire_leases(&self, spec: &Spec) {
        self.clock.advance(spec.lease_seconds as i64 * 1000 + 1);
    }

    pub async fn deliver(&self, contract: &Contract, step: &str, args: &Value) -> Outcome {
        self.executor
            .execute(contract, &op(step), args, &self.downstream)
            .await
    }

    /// Starts a delivery of `ticket("Refund")` by another worker in its own task, so a test
    /// can pause it at a gate, race it, or abort it as a crash.
    pub fn spawn_delivery(
        &self,
        worker: &str,
        contract: &Arc<Contract>,
        step: &str,
    ) -> tokio::task::JoinHandle<Outcome> {
        let (exec, contract, downstream) = (
            self.worker(worker),
            contract.clone(),
            self.downstream.clone(),
        );
        let step = step.to_string();
        tokio::spawn(async move {
            exec.execute(&contract, &op(&step), &ticket("Refund"), &downstream)
                .await
        })
    }

    pub async fn record(&self, step: &str) -> Option<Record> {
        self.store
            .inner()
            .get(&key(step))
            .await
            .expect("store read")
    }

    pub async fn event_kinds(&self, step: &str) -> Vec<EventKind> {
        self.store
            .inner()
            .events(&key(step))
            .await
            .expect("events")
            .into_iter()
            .map(|e| e.kind)
            .collect()
    }
}

/// An effect that costs nothing and always commits, with the step id as its reference: what
/// the benchmarks and probes run, so that they measure the executor and the store alone.
pub struct Noop;

impl Downstream for Noop {
    fn perform<'a>(&'a self, request: EffectRequest<'a>) -> BoxFuture<'a, EffectOutcome> {
        let receipt = Receipt {
            reference: request.key.step_id().to_string(),
            result: json!({"ok": true}),
        };
        Box::pin(std::future::ready(EffectOutcome::Committed(receipt)))
    }
    fn lookup_receipt<'a>(&'a self, _key: &'a OperationKey) -> BoxFuture<'a, Lookup> {
        Box::pin(std::future::ready(Lookup::NotFound))
    }
    fn poll_job<'a>(&'a self, _key: &'a OperationKey, _job: &'a str) -> BoxFuture<'a, JobStatus> {
        Box::pin(std::future::ready(JobStatus::Running))
    }
}

pub const TENANT: &str = "acme";
pub const ENVIRONMENT: &str = "test";
pub const WORKFLOW: &str = "run_827";

pub fn op(step: &str) -> Operation {
    Operation {
        caller: Caller {
            tenant: TENANT.into(),
            actor: "agent-1".into(),
            role: "agent".into(),
        },
        environment: ENVIRONMENT.into(),
        workflow_id: Some(WORKFLOW.into()),
        step_id: Some(step.into()),
    }
}

pub fn key(step: &str) -> OperationKey {
    OperationKey::new(TENANT, ENVIRONMENT, WORKFLOW, step).expect("scenario key")
}
