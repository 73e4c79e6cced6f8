//! `idemgate-history`: `run` a workload and check its history, `check` a history file,
//! `selftest` the checker on a recorded history with defects put back (docs/history.md).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use idemgate_history::check::{Check, check};
use idemgate_history::history;
use idemgate_history::mutate::mutate;
use idemgate_history::run::{Settings, broken_from, find_binary, run};

#[derive(Parser)]
#[command(
    name = "idemgate-history",
    about = "Record a history through the real gateway and check it"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

fn seconds(text: &str) -> Result<Duration, String> {
    let number = text.strip_suffix('s').unwrap_or(text);
    number
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("{text:?} is not a number of seconds (e.g. 60 or 60s)"))
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Flag {
    Yes,
    No,
}

impl Flag {
    fn on(self) -> bool {
        matches!(self, Flag::Yes)
    }
}

#[derive(clap::Args)]
struct RunArgs {
    /// Replays the workload's and the fake's choices (timing is the machine's).
    #[arg(long)]
    seed: Option<u64>,
    #[arg(long, default_value = "60", value_parser = seconds)]
    duration: Duration,
    #[arg(long, default_value_t = 8)]
    clients: u32,
    #[arg(long, default_value_t = 2)]
    gateways: u32,
    /// Mean time between gateway SIGKILLs; 0: none.
    #[arg(long, default_value = "8", value_parser = seconds)]
    kill_every: Duration,
    /// Use this store URL as it is (else a fresh database on DATABASE_URL's server).
    #[arg(long)]
    store_url: Option<String>,
    /// Restart this PostgreSQL cluster (`VERSION NAME`) once mid-run.
    #[arg(long)]
    pg_restart: Option<String>,
    /// Run a shell command once, this many seconds into the run (with --exec).
    #[arg(long, value_parser = seconds, requires = "exec")]
    exec_at: Option<Duration>,
    /// The command --exec-at runs (`sh -c`), recorded as a nemesis action.
    #[arg(long, requires = "exec_at")]
    exec: Option<String>,
    /// Share of perform requests the fake answers with a fault.
    #[arg(long, default_value_t = 0.25)]
    fault_rate: f64,
    /// Share of repeated deliveries preceded by a malformed body under the same key.
    #[arg(long, default_value_t = 0.05)]
    malformed_share: f64,
    /// Share of deliveries through /mcp.
    #[arg(long, default_value_t = 0.3)]
    mcp_share: f64,
    /// The two job tools hand out the same job ids (`yes`, `no`; default: when the webhook
    /// source names its tools).
    #[arg(long, value_name = "yes|no")]
    overlap_job_ids: Option<Flag>,
    /// Name the job tools in the webhook source (`tools = [...]`) (`yes`, `no`; default: when
    /// the gateway takes the member).
    #[arg(long, value_name = "yes|no")]
    webhook_tools: Option<Flag>,
    #[arg(long)]
    no_webhooks: bool,
    /// A fake with a defect on purpose: apply-twice or refuse-after-commit.
    #[arg(long)]
    broken: Option<String>,
    /// Succeed only if the checker finds violations of this check (repeatable): the
    /// self-test of a broken fake.
    #[arg(long, value_name = "CHECK")]
    expect: Vec<String>,
    #[arg(long, default_value = "90", value_parser = seconds)]
    settle: Duration,
    /// The history file (default: history-<seed>.jsonl in the work directory).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Gateway configurations and logs (default: a new temporary directory, kept).
    #[arg(long)]
    workdir: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Run a workload, write its history, check it.
    Run(Box<RunArgs>),
    /// Check a history file; exit status 1 when it breaks an invariant.
    Check { history: PathBuf },
    /// Put one defect per check into a recorded (clean) history and require each caught.
    Selftest { history: PathBuf },
}

fn main() -> ExitCode {
    match real_main() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("idemgate-history: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn real_main() -> anyhow::Result<ExitCode> {
    match Cli::parse().command {
        Command::Check { history: path } => {
            let report = check(&history::read(&path)?);
            print!("{report}");
            Ok(if report.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Selftest { history: path } => {
            let entries = history::read(&path)?;
            let clean = check(&entries);
            if !clean.ok() {
                print!("{clean}");
                anyhow::bail!("the recorded history is not clean; the self-test needs a clean one");
            }
            let mut failed = false;
            for c in Check::ALL {
                let Some(mutated) = mutate(&entries, c) else {
                    println!("{}: nothing to mutate in this history", c.name());
                    failed = true;
                    continue;
                };
                let report = check(&mutated);
                let fired = report.fired();
                let caught = fired.contains(&c);
                println!(
                    "{}: {} ({} violation(s): {})",
                    c.name(),
                    if caught { "caught" } else { "MISSED" },
                    report.violations.len(),
                    report
                        .violations
                        .first()
                        .map(|v| v.to_string())
                        .unwrap_or_default()
                );
                failed |= !caught;
            }
            Ok(if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
        Command::Run(args) => {
            let RunArgs {
                seed,
                duration,
                clients,
                gateways,
                kill_every,
                store_url,
                pg_restart,
                exec_at,
                exec,
                fault_rate,
                mcp_share,
                malformed_share,
                overlap_job_ids,
                webhook_tools,
                no_webhooks,
                broken,
                expect,
                settle,
                out,
                workdir,
            } = *args;
            let seed = seed.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64 % 1_000_000_007)
                    .unwrap_or(1)
            });
            let workdir = match workdir {
                Some(d) => d,
                None => tempfile::Builder::new()
                    .prefix("idemgate-history-")
                    .tempdir()?
                    .keep(),
            };
            let out = out.unwrap_or_else(|| workdir.join(format!("history-{seed}.jsonl")));
            let mut settings = Settings::new(seed, find_binary()?, out.clone(), workdir);
            settings.duration = duration;
            settings.clients = clients.max(1);
            settings.gateways = gateways.max(1);
            settings.kill_every = kill_every;
            settings.store_url = store_url;
            settings.pg_restart = pg_restart;
            settings.exec_at = exec_at.zip(exec);
            settings.fake.fault_rate = fault_rate;
            settings.mcp_share = mcp_share.clamp(0.0, 1.0);
            settings.malformed_share = malformed_share;
            settings.fake.overlap_job_ids = overlap_job_ids.map(Flag::on);
            settings.webhook_tools = webhook_tools.map(Flag::on);
            settings.webhooks = !no_webhooks;
            settings.fake.broken = broken.as_deref().map(broken_from).transpose()?;
            settings.settle = settle;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            runtime.block_on(run(settings))?;
            let report = check(&history::read(&out)?);
            print!("{report}");
            println!(
                "history {} (seed {seed}; replay: idemgate-history run --seed {seed} …)",
                out.display()
            );
            let expected = expect
                .iter()
                .map(|name| {
                    Check::ALL
                        .into_iter()
                        .find(|c| c.name() == name)
                        .ok_or_else(|| anyhow::anyhow!("--expect: no check named {name:?}"))
                })
                .collect::<anyhow::Result<Vec<Check>>>()?;
            let ok = if expected.is_empty() {
                report.ok()
            } else {
                let fired = report.fired();
                let missed: Vec<&str> = expected
                    .iter()
                    .filter(|c| !fired.contains(c))
                    .map(|c| c.name())
                    .collect();
                if missed.is_empty() {
                    println!("the expected violations were found: the checks fire on a real run");
                } else {
                    println!(
                        "expected violations the checker did not find: {}",
                        missed.join(", ")
                    );
                }
                missed.is_empty()
            };
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}
