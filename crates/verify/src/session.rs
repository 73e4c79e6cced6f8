//! [`Session`]: what one contract's probes share — the verification's own fault proxy in front
//! of the downstream, the real executor assembled as every face assembles it (the contract's
//! `HttpDownstream` and hook, a throwaway SQLite store), the budget, and the first effect the
//! later probes compare with.
//!
//! Every request the executor makes to the downstream goes through the proxy, which forwards
//! it unchanged unless a probe scripted a fault for its key, and records what the downstream
//! answered: that ledger is the evidence the report keeps (status codes and references as the
//! downstream gave them, before idemgate classified them).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use idemgate_app::{App, Assembly, HttpEffects, Tool, ToolSet};
use idemgate_chaos::{Config, Entry, Proxy, Running};
use idemgate_core::audit::Sealer;
use idemgate_core::effect::{EffectOutcome, EffectRequest, Lookup};
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::{Outcome, Status};
use idemgate_core::record::{Dispatch, RecordState};
use idemgate_downstream_http::HttpAuthorizer;
use idemgate_engine::{Caller, Settings};
use serde_json::Value;

use crate::budget::{Budget, Metered};
use crate::report::Answer;
use crate::target::Target;
use crate::{Error, Options};

/// The step id of every operation a verification makes; the workflow id names the run and the
/// probe.
pub(crate) const STEP: &str = "1";

/// The first effect, which later probes repeat, change, look up and compare with.
#[derive(Debug, Clone)]
pub(crate) struct First {
    pub key: OperationKey,
    pub reference: String,
    /// The job it went through, for an asynchronous contract.
    pub job_id: Option<String>,
}

/// An operation followed until it settled, or until the probe's deadline.
#[derive(Debug, Clone)]
pub(crate) struct Settled {
    /// The delivery's own answer.
    pub answered: Outcome,
    /// The last answer: the delivery's, or the status read that followed it.
    pub outcome: Outcome,
    pub job_id: Option<String>,
    /// Whether the verification approved the operation (a contract with an approval rule).
    pub approved: bool,
}

pub(crate) struct Session<'a> {
    pub target: &'a Target,
    pub options: &'a Options,
    pub run: &'a str,
    /// Sends made for this contract.
    sent: Arc<AtomicU32>,
    /// The verification's own proxy in front of the downstream.
    proxy: Running,
    pub app: App,
    /// The contract as the executor runs it (its URLs on the proxy) and its metered
    /// downstream.
    pub tool: Tool,
    /// The hook, called directly at its own URL.
    pub hook: Option<HttpAuthorizer>,
    pub caller: Caller,
    pub first: Option<First>,
    _dir: tempfile::TempDir,
}

impl<'a> Session<'a> {
    pub async fn open(
        target: &'a Target,
        options: &'a Options,
        run: &'a str,
        budget: Arc<Budget>,
    ) -> Result<Session<'a>, Error> {
        let contract = &target.contract;
        let http = contract.file.downstream.http.as_ref();
        let pointer = |path: &[&str]| -> Option<String> {
            http.and_then(|h| path.iter().try_fold(h, |at, part| at.get(part)))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let mut config = Config::new(target.base.clone());
        config.header =
            pointer(&["idempotency_header"]).unwrap_or_else(|| "Idempotency-Key".into());
        config.reference = pointer(&["reference"]).unwrap_or_default();
        config.job_id = pointer(&["job", "id"]);
        // The downstream's own timeout applies at the executor; the proxy waits a little
        // longer, so that it never gives up first and invents a failure.
        config.upstream_timeout = options.probe_timeout + Duration::from_secs(5);
        let proxy = Proxy::new(config)
            .map_err(|e| Error::Setup(e.to_string()))?
            .start(([127, 0, 0, 1], 0).into())
            .await
            .map_err(|e| Error::Setup(format!("the verification's proxy cannot listen: {e}")))?;

        let via_proxy = target.contract_via(&proxy.url())?;
        let dir = tempfile::tempdir()
            .map_err(|e| Error::Setup(format!("a temporary directory for the store: {e}")))?;
        let url = format!("sqlite://{}", dir.path().join("verify.sqlite").display());
        let store = idemgate_app::open_store(&url, Sealer::unsigned())
            .await
            .map_err(|e| Error::Setup(e.to_string()))?;
        let tools = ToolSet::build(vec![via_proxy], &HttpEffects)
            .map_err(|e| Error::Setup(e.to_string()))?;
        let sent = Arc::new(AtomicU32::new(0));
        let tools = tools.map_downstreams(|_, inner| {
            Arc::new(Metered::new(inner, budget.clone(), sent.clone()))
        });
        let settings = Settings {
            // One resend after an ambiguous answer settles a deduplicating downstream's lost
            // answer; more would spend the budget on a downstream that keeps failing.
            max_resends: 1,
            settled_records: 0,
            ..Settings::default()
        };
        let app = Assembly::new(store, tools, options.environment.clone())
            .settings(settings)
            .build();
        let tool = app
            .tools()
            .get(target.tool())
            .ok_or_else(|| Error::Setup("the tool was not registered".into()))?;
        let hook = HttpAuthorizer::from_contract(contract).map_err(|e| Error::Http {
            file: target.file.clone(),
            message: e.to_string(),
        })?;
        Ok(Session {
            target,
            options,
            run,
            sent,
            proxy,
            app,
            tool,
            hook,
            caller: Caller {
                tenant: options.tenant.clone(),
                actor: options.actor.clone(),
                role: options.role.clone(),
            },
            first: None,
            _dir: dir,
        })
    }

    /// Stops the proxy, once every request it forwards has finished.
    pub async fn close(self) {
        let _ = self.proxy.stop().await;
    }

    /// The proxy's ledger: what the downstream received and answered.
    pub fn ledger(&self) -> &idemgate_chaos::Ledger {
        self.proxy.proxy().ledger()
    }

    /// Scripts the fate of a request passing the proxy.
    pub fn script(&self, rule: idemgate_chaos::Rule) {
        self.proxy.proxy().push_rule(rule);
    }

    /// Sends made for this contract so far.
    pub fn sent(&self) -> u32 {
        self.sent.load(Ordering::SeqCst)
    }

    /// The workflow id of a probe's operation: `verify-<run>-<probe>`.
    pub fn workflow(&self, probe: &str) -> String {
        format!("verify-{}-{probe}", self.run)
    }

    /// The operation key a delivery of `probe` gets (and the downstream's idempotency key).
    pub fn key(&self, probe: &str) -> OperationKey {
        OperationKey::new(
            &self.options.tenant,
            &self.options.environment,
            &self.workflow(probe),
            STEP,
        )
        .expect("the parts were checked when the options were read")
    }

    /// One delivery through the executor, as any face makes it.
    pub async fn deliver(&self, probe: &str, arguments: &Value) -> Outcome {
        self.app
            .invoke(
                self.caller.clone(),
                self.target.tool(),
                Some(self.workflow(probe)),
                Some(STEP.to_string()),
                arguments.clone(),
            )
            .await
    }

    /// Follows an operation until it settles or `deadline` passes: approves it when it
    /// awaits approval (the verification acts as the operator of its own operations), and
    /// reads its status — which polls an accepted job — while it is in flight.
    pub async fn settle(
        &self,
        key: &OperationKey,
        answered: Outcome,
        deadline: Instant,
    ) -> Settled {
        let mut settled = Settled {
            outcome: answered.clone(),
            answered,
            job_id: None,
            approved: false,
        };
        let mut pause = Duration::from_millis(50);
        while settled.outcome.status == Status::InFlight && Instant::now() < deadline {
            let state = match self.app.executor().store().get(key).await {
                Ok(Some(record)) => Some(record.state),
                Ok(None) | Err(_) => None,
            };
            match state {
                Some(RecordState::AwaitingApproval { .. }) if !settled.approved => {
                    settled.approved = true;
                    let approval = self
                        .app
                        .executor()
                        .approve(
                            &self.tool.contract,
                            key,
                            &self.options.actor,
                            &format!("idemgate verify run {}", self.run),
                            None,
                            self.tool.downstream.as_ref(),
                        )
                        .await;
                    if let Ok(outcome) = approval {
                        settled.outcome = outcome;
                    }
                    continue;
                }
                Some(RecordState::Pending {
                    dispatch: Dispatch::Job { job_id },
                    ..
                }) => settled.job_id = Some(job_id),
                _ => {}
            }
            tokio::time::sleep(pause.min(deadline.saturating_duration_since(Instant::now()))).await;
            pause = (pause * 2).min(Duration::from_secs(1));
            if let Some(outcome) = self.app.status(&self.caller, key).await {
                settled.outcome = outcome;
            }
        }
        settled
    }

    /// Sends `arguments` to the downstream under `key` directly — not a delivery: the
    /// executor is not asked, so the downstream's own answer to a repeat is seen.
    pub async fn send(&self, key: &OperationKey, arguments: &Value) -> EffectOutcome {
        let contract = &self.tool.contract;
        self.tool
            .downstream
            .perform(EffectRequest {
                key,
                tool: &contract.name,
                tool_version: &contract.version,
                arguments,
                attempt: 1,
                precondition: contract.precondition(arguments),
            })
            .await
    }

    pub async fn lookup(&self, key: &OperationKey) -> Lookup {
        self.tool.downstream.lookup_receipt(key).await
    }

    /// Every request the downstream received under `key`, in order.
    pub fn exchanges(&self, key: &OperationKey) -> Vec<Entry> {
        self.ledger().entries_for(key.as_str())
    }

    /// The distinct references the downstream committed under `key` (and the job ids it
    /// accepted, as `job <id>`).
    pub fn committed(&self, key: &OperationKey) -> Vec<String> {
        match self.ledger().key(key.as_str()) {
            Some(summary) => {
                let mut all = summary.references;
                all.extend(summary.jobs.into_iter().map(|j| format!("job {j}")));
                all
            }
            None => Vec::new(),
        }
    }
}

/// idemgate's answer as evidence.
pub(crate) fn answer(key: &OperationKey, outcome: &Outcome) -> Answer {
    Answer {
        key: key.as_str().to_string(),
        via: "idemgate",
        outcome: outcome.status.as_str().to_string(),
        reference: outcome.effect_reference.clone(),
        // The code only: the message is the observation's, and evidence stays one line.
        detail: outcome.error.as_ref().map(|e| e.code.as_str().to_string()),
    }
}

/// A downstream answer to a probe's own send, as evidence.
pub(crate) fn sent_answer(key: &OperationKey, outcome: &EffectOutcome) -> Answer {
    let (class, reference, detail) = match outcome {
        EffectOutcome::Committed(r) => ("committed", Some(r.reference.clone()), None),
        EffectOutcome::Accepted { job_id } => ("accepted", None, Some(format!("job {job_id}"))),
        EffectOutcome::Refused(r) => ("refused", None, Some(r.message.clone())),
        EffectOutcome::PreconditionFailed(m) => ("precondition_failed", None, Some(m.clone())),
        EffectOutcome::NotSent { reason, .. } => ("not_sent", None, Some(reason.clone())),
        EffectOutcome::Ambiguous { reason, .. } => ("ambiguous", None, Some(reason.clone())),
    };
    Answer {
        key: key.as_str().to_string(),
        via: "downstream",
        outcome: class.into(),
        reference,
        detail,
    }
}
