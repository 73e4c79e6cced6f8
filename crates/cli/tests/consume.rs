//! `idemgate consume` against the real NATS JetStream on this machine: redeliveries — lost
//! acknowledgements, a consumer killed with SIGKILL and restarted, every job published twice
//! — are answered from the operation's durable record, never by a second effect. Effects are
//! counted by the fake provider on its own side.
//!
//! - `killed_consumers_and_lost_acks_cause_one_effect_per_job`: 2,000 jobs, each published
//!   twice while the load runs, the consumer killed at random moments and restarted, a tenth
//!   of its acknowledgements dropped on purpose.
//! - `bad_messages_are_refused_without_a_record_or_an_effect`: a malformed envelope, an
//!   unknown tool, invalid arguments and a key reused for other content are terminated with a
//!   log line naming the problem.
//! - `an_unknown_operation_is_parked_not_redelivered`: an effect whose answer was lost on a
//!   provider without lookup ends `unknown`; its message is acknowledged and never comes back.
//!
//! Each test uses a stream of its own, deleted at its end, and is bounded in time; each skips
//! (loudly) without a reachable NATS unless `IDEMGATE_REQUIRE_NATS=1`.

mod consume_support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use consume_support::{ConsumeProcess, Nats, config, contracts, envelope, key, provider, records};
use idemgate_conformance::http_fake::HttpFault;
use idemgate_core::record::RecordStatus;
use rand::{Rng, SeedableRng};

const JOBS: usize = 2_000;
const WORKFLOW: &str = "nightly_mail";
/// How long the load test may take, all of it.
const LOAD_LIMIT: Duration = Duration::from_secs(240);

macro_rules! nats {
    ($label:expr) => {
        match Nats::fresh($label).await {
            Some(nats) => nats,
            None => return,
        }
    };
}

fn step(n: usize) -> String {
    format!("job{n:04}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_consumers_and_lost_acks_cause_one_effect_per_job() {
    let nats = nats!("load");
    let provider = provider().await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &contracts(dir.path(), &provider));
    let seed: u64 = std::env::var("IDEMGATE_CONSUME_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("kill schedule seed {seed} (IDEMGATE_CONSUME_SEED replays it)");
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let started = Instant::now();
    let deadline = started + LOAD_LIMIT;

    let mut consumer = ConsumeProcess::new(
        dir.path(),
        &config,
        &nats,
        &[("IDEMGATE_FAULT_DROP_ACKS", "0.1")],
    );
    consumer.start();

    // Every job twice: once in order, then again in a shuffled order, published on a task of
    // its own while the consumer is being killed.
    let mut second: Vec<usize> = (0..JOBS).collect();
    for i in (1..second.len()).rev() {
        second.swap(i, rng.random_range(0..=i));
    }
    let order: Vec<usize> = (0..JOBS).chain(second).collect();
    let payloads: Vec<Vec<u8>> = order
        .iter()
        .map(|&n| {
            envelope(
                "jobs.email",
                WORKFLOW,
                &step(n),
                &format!("user{n}@example.com"),
            )
        })
        .collect();
    let publisher = {
        let js = nats.js.clone();
        let subject = nats.subject.clone();
        tokio::spawn(async move {
            // In slices with pauses, so the load lasts across several kills.
            for chunk in payloads.chunks(200) {
                let mut acks = Vec::new();
                for payload in chunk {
                    acks.push(
                        js.publish(subject.clone(), payload.clone().into())
                            .await
                            .unwrap(),
                    );
                }
                for ack in acks {
                    ack.await.expect("JetStream stores the job");
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };

    // Kill at random moments while the load runs, restarting each time.
    let kills = 6;
    for _ in 0..kills {
        let wait = Duration::from_millis(rng.random_range(300..1_800));
        tokio::time::sleep(wait).await;
        assert!(
            consumer.alive(),
            "the consumer exited on its own: {}",
            consumer.all_stderr()
        );
        consumer.kill();
        consumer.start();
    }
    publisher.await.unwrap();
    assert_eq!(
        nats.messages().await,
        2 * JOBS as u64,
        "every job is in the stream twice"
    );
    nats.wait_drained(deadline, "after the kills").await;
    let (_, _, deliveries) = nats.consumer_state().await.unwrap();
    let summary = consumer.stop();
    // Lost acknowledgements and kills came back as redeliveries.
    assert!(
        deliveries > 2 * JOBS as u64,
        "{deliveries} deliveries of {} messages: nothing was redelivered",
        2 * JOBS
    );

    // The provider's own count: one effect per job, and none twice.
    let effects = provider.downstream().effect_log();
    let mut per_key: BTreeMap<String, usize> = BTreeMap::new();
    for effect in &effects {
        *per_key.entry(effect.key.as_str().to_string()).or_default() += 1;
    }
    let doubled: Vec<_> = per_key.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        doubled.is_empty(),
        "keys with more than one effect: {doubled:?}"
    );

    // Every job's record settled, or in the reconciliation queue; an applied record names the
    // provider's one effect.
    let records = records(dir.path()).await;
    assert_eq!(records.len(), JOBS, "one record per job");
    let mut by_status: BTreeMap<&str, usize> = BTreeMap::new();
    for record in &records {
        let status = record.state.status();
        *by_status.entry(status.as_str()).or_default() += 1;
        let effects_here = provider.downstream().effects_for(&record.key);
        match status {
            RecordStatus::Applied => assert_eq!(effects_here, 1, "{} applied", record.key.as_str()),
            RecordStatus::Unknown => assert!(effects_here <= 1),
            other => panic!(
                "{} ended {other:?}: neither settled nor in the reconciliation queue",
                record.key.as_str()
            ),
        }
    }
    for n in 0..JOBS {
        assert!(
            records.iter().any(|r| r.key == key(WORKFLOW, &step(n))),
            "job {n} has no record"
        );
    }
    let applied = by_status.get("applied").copied().unwrap_or(0);
    assert!(applied >= JOBS * 9 / 10, "most jobs applied: {by_status:?}");
    eprintln!(
        "{JOBS} jobs, {} messages, {deliveries} deliveries, {} consumer runs ({} SIGKILLs); \
         records {by_status:?}; provider effects {} on {} keys, {} requests; {:.1} s; last run: {}",
        2 * JOBS,
        consumer.runs,
        consumer.kills,
        effects.len(),
        per_key.len(),
        provider.requests().len(),
        started.elapsed().as_secs_f64(),
        summary.lines().last().unwrap_or_default(),
    );
    assert!(summary.contains("acknowledgements dropped"), "{summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_messages_are_refused_without_a_record_or_an_effect() {
    let nats = nats!("bad");
    let provider = provider().await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &contracts(dir.path(), &provider));
    let mut consumer = ConsumeProcess::new(dir.path(), &config, &nats, &[]);
    consumer.start();
    let deadline = Instant::now() + Duration::from_secs(60);

    let good = envelope("jobs.email", "bad_run", "good", "ada@example.com");
    nats.publish_all([good]).await;
    nats.wait_drained(deadline, "the good job").await;
    nats.publish_all([
        b"{not json".to_vec(),
        br#"{"workflow_id":"bad_run","step_id":"x","tool":"jobs.email","arguments":{},"message_id":"m1"}"#.to_vec(),
        envelope("no.such.tool", "bad_run", "tool", "ada@example.com"),
        br#"{"workflow_id":"bad_run","step_id":"args","tool":"jobs.email","arguments":{"to":"ada@example.com"}}"#.to_vec(),
        br#"{"workflow_id":"bad:run","step_id":"key","tool":"jobs.email","arguments":{"to":"ada@example.com","body":"b"}}"#.to_vec(),
        // The good job's key with other content: refused, and the first effect stands.
        envelope("jobs.email", "bad_run", "good", "eve@example.com"),
    ])
    .await;
    nats.wait_drained(deadline, "the bad messages").await;
    let (_, _, deliveries) = nats.consumer_state().await.unwrap();
    consumer.stop();
    let (_, stderr) = consumer.output(0);

    assert_eq!(
        provider.downstream().effects(),
        1,
        "only the good job had an effect"
    );
    let records = records(dir.path()).await;
    assert_eq!(
        records.len(),
        1,
        "only the good job has a record: {records:?}"
    );
    assert_eq!(records[0].state.status(), RecordStatus::Applied);
    assert_eq!(deliveries, 7, "a refused message is not delivered again");
    for problem in [
        "message refused, no record and no effect: the envelope is not strict JSON",
        "unknown field `message_id`",
        "no tool `no.such.tool` is loaded here",
        "invalid_arguments",
        "invalid_operation_key",
        "idempotency_key_reused_with_different_request",
    ] {
        assert!(
            stderr.contains(problem),
            "no log line names {problem:?}:\n{stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_operation_is_parked_not_redelivered() {
    let nats = nats!("unknown");
    let provider = provider().await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &contracts(dir.path(), &provider));
    // The provider commits and drops the connection: the answer is lost, and `jobs.notify`
    // has no receipt lookup to settle it.
    provider.push_fault(HttpFault::CommitThenDrop);
    let mut consumer = ConsumeProcess::new(dir.path(), &config, &nats, &[]);
    consumer.start();
    let deadline = Instant::now() + Duration::from_secs(60);
    nats.publish_all([envelope(
        "jobs.notify",
        "park_run",
        "notify",
        "ada@example.com",
    )])
    .await;
    nats.wait_drained(deadline, "the job").await;
    // Longer than the ack wait: a message that had been returned would be back by now.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let state = nats.consumer_state().await.unwrap();
    let summary = consumer.stop();

    assert_eq!(provider.downstream().effects(), 1);
    let records = records(dir.path()).await;
    assert_eq!(records.len(), 1);
    assert_eq!(
        records[0].state.status(),
        RecordStatus::Unknown,
        "in the reconciliation queue"
    );
    assert_eq!(state, (0, 0, 1), "acknowledged once, never redelivered");
    assert!(summary.contains("parked 1"), "{summary}");
}
