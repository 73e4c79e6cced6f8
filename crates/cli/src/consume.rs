//! `idemgate consume`: the queue consumer on NATS JetStream, over the same assembly as
//! `serve` — the configuration's store, contracts and downstreams, one executor, and the
//! recoverer — so a job delivered through the queue and a call through the gateway with the
//! same workflow step are one operation.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use idemgate_app::config::{Config, File};
use idemgate_queue::nats::{self, AckFault, Options, Report};
use idemgate_queue::{Consumer, envelope};

/// The test-only fault switch: the share (0 to 1) of acknowledgements this process drops.
const DROP_ACKS_VAR: &str = "IDEMGATE_FAULT_DROP_ACKS";

/// Flags of `idemgate consume`.
#[derive(Debug, clap::Args)]
pub struct ConsumeArgs {
    /// The NATS server.
    #[arg(
        long,
        value_name = "URL",
        env = "IDEMGATE_NATS_URL",
        default_value = "nats://127.0.0.1:4222"
    )]
    nats: String,
    /// The JetStream stream to read; created with the subjects when it does not exist.
    #[arg(long, value_name = "NAME")]
    stream: String,
    /// A subject this consumer takes from the stream (repeatable; wildcards allowed).
    #[arg(long = "subject", value_name = "SUBJECT", required = true)]
    subjects: Vec<String>,
    /// The durable consumer's name; processes with the same name share the work.
    #[arg(long, value_name = "NAME", default_value = "idemgate")]
    durable: String,
    /// The tenant every job's operation belongs to (the first part of its key). Producers
    /// never choose it.
    #[arg(long, value_name = "TENANT")]
    tenant: String,
    /// The actor recorded for a job whose envelope names none.
    #[arg(long, value_name = "NAME", default_value = "queue")]
    actor: String,
    /// Messages delivered and unacknowledged at most, and handled at once.
    #[arg(long, value_name = "N", default_value_t = 32)]
    max_in_flight: usize,
    /// Seconds before an unacknowledged message is delivered again.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    ack_wait: u64,
    /// Deliveries of one message at most (-1: no bound).
    #[arg(long, value_name = "N", default_value_t = -1, allow_negative_numbers = true)]
    max_deliver: i64,
    /// The gateway's configuration file (TOML): store, environment, contracts, executor,
    /// recovery.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Without --config: the store URL (`sqlite://PATH` or `postgres://…`).
    #[arg(long, value_name = "URL", conflicts_with = "config")]
    store: Option<String>,
    /// Without --config: contract files or globs (repeatable; default contracts/*.yaml).
    #[arg(long = "contracts", value_name = "GLOB", conflicts_with = "config")]
    contracts: Vec<String>,
    /// Without --config: the environment part of every operation key.
    #[arg(long, value_name = "NAME", conflicts_with = "config")]
    environment: Option<String>,
    /// Without --config: perform effects in the in-process sandbox (not real).
    #[arg(long, conflicts_with = "config")]
    sandbox: bool,
}

/// The configuration from --config, or one made of the flags.
fn configuration(args: &ConsumeArgs) -> anyhow::Result<File> {
    if let Some(path) = &args.config {
        return Ok(File::load(path)?);
    }
    let mut config = Config::development();
    config.sandbox = args.sandbox;
    if let Some(store) = &args.store {
        config.store = store.clone();
    }
    if !args.contracts.is_empty() {
        config.contracts = args.contracts.clone();
    }
    if let Some(environment) = &args.environment {
        config.environment = environment.clone();
    }
    Ok(File::from_config(config))
}

fn ack_fault() -> anyhow::Result<AckFault> {
    let Ok(text) = std::env::var(DROP_ACKS_VAR) else {
        return Ok(AckFault::none());
    };
    let fraction: f64 = text
        .trim()
        .parse()
        .with_context(|| format!("{DROP_ACKS_VAR}={text:?} is not a number"))?;
    let seed = u64::from(std::process::id())
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or_default();
    AckFault::dropping(fraction, seed).map_err(|e| anyhow::anyhow!("{DROP_ACKS_VAR}: {e}"))
}

pub async fn run(args: ConsumeArgs) -> anyhow::Result<()> {
    let file = configuration(&args)?;
    let app = file.assembly(file.tools()?).await?.build();
    let config = &file.config;
    let options = Options {
        durable: args.durable.clone(),
        max_in_flight: args.max_in_flight,
        ack_wait: Duration::from_secs(args.ack_wait.max(1)),
        max_deliver: args.max_deliver,
        ack_fault: ack_fault()?,
        ..Options::new(args.stream.clone(), args.subjects.clone())
    };
    let consumer = Consumer::new(app.clone(), args.tenant.clone(), args.actor.clone())
        .with_limits(envelope::Limits::from_file(&file)?);
    let client = async_nats::connect(args.nats.as_str())
        .await
        .with_context(|| format!("connecting to NATS at {}", args.nats))?;

    println!(
        "idemgate consuming stream {} (durable {}, subjects {}) at {}",
        options.stream,
        options.durable,
        options.subjects.join(", "),
        args.nats
    );
    println!(
        "  tenant {}, environment {}, store {}, tools: {}",
        args.tenant,
        config.environment,
        idemgate_app::redact(&config.store),
        app.tools().names().join(", ")
    );

    // The recoverer finishes what a killed consumer left pending, as in `serve` (its
    // `[recovery]` intervals).
    let background = app.start_recoverer();
    let report = Arc::new(Report::default());
    let result = nats::run(client, consumer, options, report.clone(), async {
        crate::signals::shutdown().await;
        println!("idemgate: shutting down; finishing the messages in hand");
    })
    .await;
    background.stop().await;
    println!("idemgate consume: {}", report.summary());
    Ok(result?)
}
