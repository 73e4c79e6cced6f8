//! `idemgate`, the command line over idemgate's core.
//!
//! One module per group of subcommands; each exposes a clap `Command` enum and a `run` that
//! returns the process exit code. This file only parses the command line, dispatches, and turns
//! an error into a message and exit status 2.
//!
//! Exit statuses: 0 success; 1 the command ran and found problems (a linter error, a refuted
//! claim, a duplicate effect the chaos proxy saw); 2 the command could not do its job (bad
//! input, unreadable file, refused contract, usage).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod arenas;
mod audit;
mod chaos;
mod conformance;
mod consume;
mod contract;
mod demo;
mod logs;
mod mcp;
mod migrate;
mod ops;
mod outbox;
mod serve;
mod signals;
mod stores;
mod token;
#[cfg(feature = "otel")]
mod traces;
mod verify;
mod wrap;

#[derive(Debug, Parser)]
#[command(
    name = "idemgate",
    version,
    about = "Make side-effecting tools safe to retry for AI agents."
)]
struct Cli {
    /// How log lines are written to stderr: `text` for people, `json` (one object per line)
    /// for collectors. Colour only when stderr is a terminal.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "IDEMGATE_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Review tool contracts and compute request fingerprints.
    #[command(subcommand)]
    Contract(contract::Command),
    /// The lost-response story end to end, on an embedded SQLite file in a temporary directory.
    Demo,
    /// Run the fault matrix (every duplicate, lost-answer, crash and retention scenario) on
    /// embedded SQLite, with the `idemgate-conformance` runner beside this binary.
    Conformance(conformance::ConformanceArgs),
    /// Serve API v1 over HTTP: tools from contracts, the recoverer and the retention sweeper.
    Serve(serve::ServeArgs),
    /// Serve the contracts as MCP tools over stdio, for one local agent.
    Mcp(mcp::McpArgs),
    /// Put the executor in front of any stdio MCP server: `idemgate wrap -- <command> [args…]`.
    Wrap(wrap::WrapArgs),
    /// Operators' actions: the reconciliation queue, approvals, timelines. Against a gateway
    /// (default http://127.0.0.1:8080; the token is read from IDEMGATE_TOKEN), or on a store
    /// directly with --store URL.
    Ops(ops::OpsArgs),
    /// Mint bearer tokens for the gateway's configuration.
    #[command(subcommand)]
    Token(token::Command),
    /// Apply a store's schema migrations and report its schema version.
    Migrate(migrate::MigrateArgs),
    /// Consume jobs from NATS JetStream: each message's envelope names its operation, which
    /// is claimed like any other before the effect; acknowledged once its record settles.
    Consume(consume::ConsumeArgs),
    /// The transactional outbox of an application's own database.
    #[command(subcommand)]
    Outbox(outbox::Command),
    /// The signed log of operator actions: keygen, export, verify.
    #[command(subcommand)]
    Audit(audit::Command),
    /// Check a contract's claims against its real downstream (staging) through the executor,
    /// within a budget of effects; exits 1 when a claim is refuted.
    Verify(verify::VerifyArgs),
    /// A fault-injecting HTTP proxy for end-to-end tests (loopback or staging): lost answers,
    /// resets, delays, 5xx and malformed answers, duplicate deliveries; a ledger per key; exits
    /// 1 when one key committed twice with different references.
    Chaos(chaos::ChaosArgs),
}

/// Logs go to stderr. `RUST_LOG` chooses what is logged; without it a server logs at `info`
/// (the access log, one line per request) and every other command logs nothing: the demo's
/// output is for people, and keys, fingerprints and references are all a log line would add.
/// A server also exports traces when the OTLP variables ask for it (see `traces`). Lines are
/// written by a thread of their own (`logs`); the returned writer is flushed before exiting.
fn logs(format: LogFormat, server: bool) -> (Option<Traces>, logs::Lines) {
    use std::io::IsTerminal;
    use tracing_subscriber::filter::FilterExt;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{EnvFilter, Layer, Registry};
    let filter = || match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.trim().is_empty() => EnvFilter::new(directives),
        _ if server => EnvFilter::new("warn,idemgate=info"),
        _ => EnvFilter::new("off"),
    };
    let lines = logs::Lines::stderr();
    let fmt = tracing_subscriber::fmt::layer().with_writer(lines.clone());
    let fmt = match format {
        LogFormat::Json => fmt
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(true)
            .with_filter(filter())
            .boxed(),
        LogFormat::Text => fmt
            .with_ansi(std::io::stderr().is_terminal())
            .with_filter(filter())
            .boxed(),
    };
    let mut layers: Vec<Box<dyn Layer<Registry> + Send + Sync>> = vec![fmt];
    // Each layer has its own filter. The delivery's stage spans (claim, authorize, downstream,
    // finalise, lookup) are at debug, so the log leaves them out and, with no exporter, nobody
    // creates them; the exporter takes them whatever the log's level.
    let traces = if server { traces_layer() } else { None };
    let traces = traces.map(|(layer, traces)| {
        let stages = tracing_subscriber::filter::filter_fn(|meta| {
            meta.is_span()
                && meta.target().starts_with("idemgate")
                && *meta.level() <= tracing::Level::DEBUG
        });
        layers.push(layer.with_filter(stages.or(filter())).boxed());
        traces
    });
    let _ = Registry::default().with(layers).try_init();
    (traces, lines)
}

#[cfg(feature = "otel")]
type Traces = traces::Traces;
#[cfg(not(feature = "otel"))]
struct Traces;
#[cfg(not(feature = "otel"))]
impl Traces {
    fn shutdown(self) {}
}

#[cfg(feature = "otel")]
fn traces_layer() -> Option<(
    Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync>,
    Traces,
)> {
    traces::layer()
}

#[cfg(not(feature = "otel"))]
fn traces_layer() -> Option<(
    Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync>,
    Traces,
)> {
    None
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

/// The exit status of a command that could not do its job.
const FAILURE: u8 = 2;

/// The process's allocator: mimalloc rather than glibc's malloc. Under the gateway's unique-key
/// load glibc spent about 13 % of the process's CPU samples in `malloc`, `free` and their
/// consolidation of freed chunks (docs/benchmarks/history.md, "The allocator and the spawned
/// delivery"); mimalloc's per-thread free lists avoid most of it, at a higher but bounded RSS.
/// SQLite's own allocations still go to the C library's `malloc`, which `arenas` bounds.
///
/// Freed pages go back to the system at once rather than after mimalloc's default 1 s: with
/// the delay the default gateway peaked at 95–98 MB VmHWM after 40 s of 32-way unique load,
/// without it at 81–85 MB (glibc: 65–77 MB).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc's `mi_option_t` (`include/mimalloc.h`; the Rust
/// bindings name no constant for it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// An operator's own `MIMALLOC_PURGE_DELAY` wins (mimalloc read it at start).
fn allocator_options() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: sets one of the allocator's options; mimalloc reads its options when it decides,
    // and any value of this one is valid.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) }
}

fn main() -> ExitCode {
    arenas::limit();
    allocator_options();
    let cli = Cli::parse();
    // `idemgate mcp` speaks JSON-RPC on stdout; its logs, like every command's, go to stderr.
    let (traces, lines) = logs(
        cli.log_format,
        matches!(
            cli.command,
            Command::Serve(_)
                | Command::Mcp(_)
                | Command::Wrap(_)
                | Command::Consume(_)
                | Command::Outbox(_)
        ),
    );
    let result = match cli.command {
        Command::Contract(command) => contract::run(command),
        Command::Demo => runtime()
            .and_then(|rt| rt.block_on(demo::run()))
            .map(|()| ExitCode::SUCCESS),
        Command::Conformance(args) => conformance::run(args),
        Command::Serve(args) => runtime()
            .and_then(|rt| rt.block_on(serve::run(args)))
            .map(|()| ExitCode::SUCCESS),
        Command::Mcp(args) => runtime()
            .and_then(|rt| rt.block_on(mcp::run(args)))
            .map(|()| ExitCode::SUCCESS),
        Command::Wrap(args) => runtime()
            .and_then(|rt| rt.block_on(wrap::run(args)))
            .map(|()| ExitCode::SUCCESS),
        Command::Ops(args) => runtime().and_then(|rt| rt.block_on(ops::run(args))),
        Command::Token(command) => token::run(command),
        Command::Migrate(args) => runtime().and_then(|rt| rt.block_on(migrate::run(args))),
        Command::Consume(args) => runtime()
            .and_then(|rt| rt.block_on(consume::run(args)))
            .map(|()| ExitCode::SUCCESS),
        Command::Outbox(command) => runtime()
            .and_then(|rt| rt.block_on(outbox::run(command)))
            .map(|()| ExitCode::SUCCESS),
        Command::Audit(command) => runtime().and_then(|rt| rt.block_on(audit::run(command))),
        Command::Verify(args) => runtime().and_then(|rt| rt.block_on(verify::run(args))),
        Command::Chaos(args) => runtime().and_then(|rt| rt.block_on(chaos::run(args))),
    };
    if let Some(traces) = traces {
        traces.shutdown();
    }
    lines.flush();
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("idemgate: error: {error:#}");
            ExitCode::from(FAILURE)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bindings have no name for the option, so the number is checked by its default:
    /// `mi_option_purge_delay` defaults to 1000 (ms) in mimalloc v3 (`src/options.c`; the
    /// header's comment still says 10), and its neighbours (a deprecated option,
    /// `use_numa_nodes`) to 0. Setting it then reads 0.
    #[test]
    fn the_purge_delay_option_is_the_one_set() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            return;
        }
        // SAFETY: reads and sets an allocator option; any value of this one is valid.
        unsafe {
            assert_eq!(libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY), 1000);
            allocator_options();
            assert_eq!(libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY), 0);
        }
    }
}
