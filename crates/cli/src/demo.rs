//! `idemgate demo`: the seed's lost-response story, end to end, on an embedded SQLite file.

use std::sync::Arc;

use anyhow::Context;
use idemgate_core::clock::{Clock, ManualClock};
use idemgate_core::contract::Contract;
use idemgate_core::effect::{
    AllowAll, Downstream, EffectOutcome, EffectRequest, JobStatus, Lookup,
};
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::{Outcome, Status};
use idemgate_core::record::{Dispatch, Record, RecordState, RecordStatus};
use idemgate_core::store::{BoxFuture, Filter, Store};
use idemgate_engine::{Caller, Executor, Operation, Settings};
use idemgate_sandbox::{Fault, Sandbox};
use idemgate_store_sqlite::{Options, SqliteStore};
use serde_json::{Value, json};

const TICKETS: &str = include_str!("../../../contracts/tickets.create.yaml");
const EMAIL: &str = include_str!("../../../contracts/email.send.yaml");
const EPOCH: i64 = 1_767_225_600_000;

struct Demo {
    store: Arc<SqliteStore>,
    clock: Arc<ManualClock>,
    deliveries: usize,
}

impl Demo {
    fn worker(&self, name: &str) -> Executor {
        Executor::new(
            self.store.clone(),
            self.clock.clone(),
            Arc::new(AllowAll),
            Settings {
                worker: name.into(),
                ..Settings::default()
            },
        )
    }

    async fn deliver(
        &mut self,
        worker: &str,
        contract: &Contract,
        step: &str,
        args: &Value,
        downstream: &Sandbox,
    ) -> Outcome {
        self.deliveries += 1;
        self.worker(worker)
            .execute(contract, &operation(step), args, downstream)
            .await
    }

    async fn record(&self, key: &OperationKey) -> anyhow::Result<Record> {
        self.store
            .get(key)
            .await?
            .context("the demo's record is missing")
    }

    fn elapsed(&self, at: i64) -> String {
        let ms = at - EPOCH;
        format!(
            "{:02}:{:02}.{:03}",
            ms / 60_000,
            (ms / 1000) % 60,
            ms % 1000
        )
    }
}

/// The ticket service as worker-a sees it: the effect commits, and the worker dies before the
/// answer reaches it (the demo aborts its task once `committed` fires).
struct DiesAfterCommit {
    service: Sandbox,
    committed: std::sync::Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
}

impl Downstream for DiesAfterCommit {
    fn perform<'a>(&'a self, request: EffectRequest<'a>) -> BoxFuture<'a, EffectOutcome> {
        Box::pin(async move {
            let _ = self.service.perform(request).await;
            let fired = self.committed.lock().ok().and_then(|mut c| c.take());
            if let Some(fired) = fired {
                let _ = fired.send(());
            }
            std::future::pending().await
        })
    }

    fn lookup_receipt<'a>(&'a self, key: &'a OperationKey) -> BoxFuture<'a, Lookup> {
        self.service.lookup_receipt(key)
    }

    fn poll_job<'a>(&'a self, key: &'a OperationKey, job_id: &'a str) -> BoxFuture<'a, JobStatus> {
        self.service.poll_job(key, job_id)
    }
}

fn operation(step: &str) -> Operation {
    Operation {
        caller: Caller {
            tenant: "acme".into(),
            actor: "support-agent".into(),
            role: "agent".into(),
        },
        environment: "demo".into(),
        workflow_id: Some("run_827".into()),
        step_id: Some(step.into()),
    }
}

fn key(step: &str) -> OperationKey {
    OperationKey::new("acme", "demo", "run_827", step).expect("demo key")
}

fn heading(n: &str, text: &str) {
    println!("\n━━ {n}. {text}");
}

fn show(outcome: &Outcome) {
    let mut line = format!("   → {}", outcome.status.as_str());
    if let Some(r) = &outcome.effect_reference {
        line.push_str(&format!(" · {r}"));
    }
    if let Some(e) = &outcome.error {
        line.push_str(&format!(" · {}", e.code.as_str()));
    }
    line.push_str(&format!(
        " · next_action={} · safe_to_repeat={}",
        serde_json::to_value(outcome.next_action)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
        outcome.safe_to_repeat()
    ));
    if let Some(s) = outcome.retry_after_seconds {
        line.push_str(&format!(" · retry_after={s}s"));
    }
    println!("{line}");
    if let Some(e) = &outcome.error {
        println!("     {}", e.message);
    }
}

fn count(what: &str, n: u64) {
    println!("   {what}: {n} (counted by the downstream itself)");
}

fn describe(record: &Record, now: i64) -> String {
    match &record.state {
        RecordState::Pending { lease, dispatch } => {
            // In words: a tool whose service deduplicates on the key needs no marker, so "no
            // marker" says nothing about whether the request left.
            let dispatch = match dispatch {
                Dispatch::NotSent => "no dispatch marker".to_string(),
                Dispatch::Sent => "dispatch marker written (may have been sent)".to_string(),
                Dispatch::Job { job_id } => format!("job {job_id} running"),
            };
            format!(
                "pending · lease {} · expires in {}s · {dispatch} · attempt {}",
                lease.owner.as_deref().unwrap_or("released"),
                (lease.expires_at - now) / 1000,
                record.fence
            )
        }
        other => {
            format!("{} · attempt {}", record.status().as_str(), record.fence)
                + &match other {
                    RecordState::Applied(r) => format!(" · {}", r.reference),
                    _ => String::new(),
                }
        }
    }
}

pub async fn run() -> anyhow::Result<()> {
    let dir = tempfile::tempdir().context("creating a temporary directory")?;
    let path = dir.path().join("idemgate.sqlite");
    let store = Arc::new(
        SqliteStore::open(&path, Options::default())
            .with_context(|| format!("opening {}", path.display()))?,
    );
    let mut demo = Demo {
        store,
        clock: Arc::new(ManualClock::new(EPOCH)),
        deliveries: 0,
    };
    let tickets_contract = Contract::load(TICKETS, "contracts/tickets.create.yaml")?;
    let email_contract = Contract::load(EMAIL, "contracts/email.send.yaml")?;
    let tickets = Sandbox::new("ticket")
        .deduplicating(true)
        .with_receipt_lookup(true);
    let mail = Sandbox::new("email")
        .deduplicating(false)
        .with_receipt_lookup(true);

    println!(
        "idemgate demo — a ticket, a lost answer, and a retry that must not create a second ticket"
    );
    println!(
        "   store: SQLite at {} (WAL, synchronous=FULL)",
        path.display()
    );
    println!(
        "   clock: starts at 2026-01-01T00:00:00Z and is moved by hand, so leases expire on cue"
    );

    let step = "record_issue";
    let args = json!({
        "queue_id": "support",
        "subject": "Refund request",
        "body": "Order 42 arrived broken; the customer asks for a refund."
    });

    heading(
        "1",
        "An agent creates a ticket; the ticket service commits it and the answer is lost",
    );
    println!(
        "   tool {} {} · {} · the service deduplicates on the key and can look a receipt up by it",
        tickets_contract.name,
        tickets_contract.version,
        tickets_contract.effect_class.as_str()
    );
    println!("   operation {}", key(step));
    let (committed, heard) = tokio::sync::oneshot::channel();
    let crashed = {
        let exec = demo.worker("worker-a");
        let (ds, c, a) = (
            DiesAfterCommit {
                service: tickets.clone(),
                committed: std::sync::Mutex::new(Some(committed)),
            },
            Contract::load(TICKETS, "tickets")?,
            args.clone(),
        );
        tokio::spawn(async move { exec.execute(&c, &operation(step), &a, &ds).await })
    };
    demo.deliveries += 1;
    let _ = heard.await;
    crashed.abort();
    let _ = crashed.await;
    println!(
        "   worker-a claimed the operation and sent it; the service committed; worker-a died before hearing back"
    );
    let record = demo.record(&key(step)).await?;
    println!("   record: {}", describe(&record, demo.clock.now()));
    count("tickets", tickets.effects());

    heading("2", "The agent retries at once, through another worker");
    let o = demo
        .deliver("worker-b", &tickets_contract, step, &args, &tickets)
        .await;
    show(&o);
    println!(
        "   worker-a's lease is still live, so worker-b sends nothing: the claim is not proof either way"
    );
    count("tickets", tickets.effects());

    heading(
        "3",
        "31 seconds later the lease has expired; the agent retries again",
    );
    demo.clock.advance(31_000);
    let o = demo
        .deliver("worker-b", &tickets_contract, step, &args, &tickets)
        .await;
    show(&o);
    println!("   recovery looked the receipt up by operation key instead of sending again");
    count("tickets", tickets.effects());
    let reference = o.effect_reference.clone().unwrap_or_default();

    heading(
        "4",
        "The model re-plans and sends a different subject under the same step",
    );
    let mut changed = args.clone();
    changed["subject"] = json!("Refund request (urgent)");
    let o = demo
        .deliver("worker-b", &tickets_contract, step, &changed, &tickets)
        .await;
    show(&o);
    count("tickets", tickets.effects());

    heading("5", "Another retry of the original call, a minute later");
    demo.clock.advance(60_000);
    let o = demo
        .deliver("worker-c", &tickets_contract, step, &args, &tickets)
        .await;
    show(&o);
    count("tickets", tickets.effects());

    heading(
        "6",
        "An irreversible email whose outcome cannot be proved at first",
    );
    println!(
        "   tool {} {} · {} · approval by default · the provider does not deduplicate; its log can be searched by key",
        email_contract.name,
        email_contract.version,
        email_contract.effect_class.as_str()
    );
    let email_step = "notify_customer";
    let email = json!({
        "to": "customer@example.com",
        "subject": "Your refund",
        "body": format!("We opened {reference} for your refund.")
    });
    let o = demo
        .deliver("worker-b", &email_contract, email_step, &email, &mail)
        .await;
    show(&o);
    // The provider commits the message but the connection drops, and its log has not indexed
    // it yet: nothing can prove the outcome.
    mail.push_fault(Fault::CommitThenDrop);
    mail.set_receipt_lookup(false);
    let approver = demo.worker("worker-b");
    let o = approver
        .approve(
            &email_contract,
            &key(email_step),
            "operator-1",
            "approved in the demo",
            None,
            &mail,
        )
        .await?;
    println!(
        "   operator-1 approves; the provider commits, the answer is lost, its log is behind:"
    );
    show(&o);
    let o = demo
        .deliver("worker-c", &email_contract, email_step, &email, &mail)
        .await;
    println!("   the agent retries:");
    show(&o);
    let queue = demo
        .store
        .list(Filter {
            tenant: Some("acme".into()),
            status: Some(RecordStatus::Unknown),
            ..Filter::default()
        })
        .await?;
    println!("   reconciliation queue: {} operation(s)", queue.len());
    count("emails", mail.effects());
    mail.set_receipt_lookup(true);
    let o = approver
        .reconcile(
            &email_contract,
            &key(email_step),
            None,
            "operator-1",
            "looked up in the demo",
            &mail,
        )
        .await?;
    println!("   the provider's log catches up; operator-1 reconciles by receipt lookup:");
    show(&o);
    let o = demo
        .deliver("worker-c", &email_contract, email_step, &email, &mail)
        .await;
    println!("   a late retry of the email:");
    show(&o);
    count("emails", mail.effects());

    heading("7", format!("The trace of {}", key(step)).as_str());
    for event in demo.store.events(&key(step)).await? {
        println!(
            "   {}  {:<13} attempt {}  {:<9} {}",
            demo.elapsed(event.at),
            event.kind.as_str(),
            event.attempt,
            event.worker,
            event.detail.unwrap_or_default()
        );
    }
    println!(
        "   replays, waits and rejections change nothing, so they are logged per delivery rather than stored"
    );

    println!(
        "\n{} deliveries · {} ticket and {} email on the downstreams' own counts · {} second effects",
        demo.deliveries,
        tickets.effects(),
        mail.effects(),
        (tickets.effects() + mail.effects()).saturating_sub(2)
    );
    let ok = tickets.effects() == 1
        && mail.effects() == 1
        && demo.record(&key(step)).await?.status() == RecordStatus::Applied
        && o.status == Status::Replayed;
    if !ok {
        anyhow::bail!("the demo did not end with one ticket and one email; this is a bug");
    }
    Ok(())
}
