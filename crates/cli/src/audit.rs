//! `idemgate audit keygen|export|verify`: the signed log of operator actions.
//!
//! `keygen` prints a new Ed25519 key pair (the seed for `IDEMGATE_AUDIT_KEY`, the public key
//! for `verify`); `export` writes a store's log as JSON lines; `verify` checks an export
//! offline — chain, hashes and every signature — and names the first broken entry.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, anyhow, bail};
use idemgate_app::redact;
use idemgate_audit::{Expect, KEY_VAR, PublicKey, SigningKey};

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Print a new signing key pair: the secret for IDEMGATE_AUDIT_KEY and its public key.
    Keygen {
        /// Print one JSON document (`secret_key`, `public_key`).
        #[arg(long)]
        json: bool,
    },
    /// Write the store's audit log as JSON lines, oldest first.
    Export(ExportArgs),
    /// Verify an exported log offline: sequence, hash chain and every signature. Exit status
    /// 1 names the first broken entry.
    Verify(VerifyArgs),
}

#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// sqlite://PATH or postgres://USER@HOST/DATABASE.
    #[arg(
        long,
        env = "IDEMGATE_STORE",
        value_name = "URL",
        conflicts_with = "config"
    )]
    store: Option<String>,
    /// The gateway's configuration file, to export the store it names.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Write to this file instead of standard output.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// The exported log (JSON lines), or `-` for standard input.
    file: PathBuf,
    /// The public key every entry must be signed by (64 hex digits, as `keygen` printed it).
    #[arg(long, value_name = "K", required_unless_present = "chain_only")]
    public_key: Option<String>,
    /// Check only the chain (sequence, links, hashes), not signatures: for a log written
    /// without IDEMGATE_AUDIT_KEY. It proves nothing against someone who can write the store.
    #[arg(long, conflicts_with = "public_key")]
    chain_only: bool,
    /// The sequence number the log must end at (the store's last, as `export` reported it):
    /// a file alone cannot show that entries were cut from its end.
    #[arg(long, value_name = "SEQ")]
    expect_last: Option<u64>,
}

pub async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Keygen { json } => keygen(json),
        Command::Export(args) => export(args).await,
        Command::Verify(args) => verify(args),
    }
}

fn keygen(json: bool) -> anyhow::Result<ExitCode> {
    let key = SigningKey::generate().map_err(|e| anyhow!("no randomness from the OS: {e}"))?;
    if json {
        let doc = serde_json::json!({
            "secret_key": key.seed_hex(),
            "public_key": key.public().to_string(),
        });
        println!("{doc}");
    } else {
        println!("audit signing key (shown only now; it is kept nowhere):");
        println!();
        println!("  {KEY_VAR}={}", key.seed_hex());
        println!();
        println!("public key, for `idemgate audit verify --public-key`:");
        println!();
        println!("  {}", key.public());
        println!();
        println!(
            "Give every gateway of one store the same {KEY_VAR} (from a secret store, never a \
             command line), and keep the public key with whoever verifies exports."
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn export(args: ExportArgs) -> anyhow::Result<ExitCode> {
    let url = match (&args.store, &args.config) {
        (Some(url), _) => url.trim().to_string(),
        (None, Some(path)) => {
            idemgate_app::config::File::load(path)
                .map_err(|e| anyhow!("{e}"))?
                .config
                .store
        }
        (None, None) => bail!("name the store: --store URL (or IDEMGATE_STORE), or --config FILE"),
    };
    let store = crate::stores::open(&url).await?;
    let mut out: Box<dyn Write> = match &args.out {
        Some(path) => Box::new(BufWriter::new(
            File::create(path).with_context(|| format!("creating {}", path.display()))?,
        )),
        None => Box::new(BufWriter::new(std::io::stdout().lock())),
    };
    let (mut count, mut last) = (0u64, None);
    let mut after = 0;
    loop {
        let page = store
            .audit_log(after, 1000)
            .await
            .with_context(|| format!("reading the audit log of {}", redact(&url)))?;
        let Some(tail) = page.last() else { break };
        after = tail.seq;
        for entry in &page {
            serde_json::to_writer(&mut out, entry)?;
            out.write_all(b"\n")?;
        }
        count += page.len() as u64;
        last = page.last().map(|e| (e.seq, e.hash.clone()));
    }
    out.flush()?;
    match last {
        Some((seq, hash)) => eprintln!(
            "exported {count} audit entries of {}; the last is entry {seq}, hash {hash} \
             (verify with --expect-last {seq})",
            redact(&url)
        ),
        None => eprintln!("the audit log of {} is empty", redact(&url)),
    }
    Ok(ExitCode::SUCCESS)
}

fn verify(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let expect = match &args.public_key {
        Some(text) => {
            Expect::SignedBy(PublicKey::parse("--public-key", text).map_err(|e| anyhow!("{e}"))?)
        }
        None => Expect::ChainOnly,
    };
    let shown = args.file.display().to_string();
    let result = if shown == "-" {
        idemgate_audit::verify(std::io::stdin().lock(), expect)
    } else {
        let file = File::open(&args.file).with_context(|| format!("opening {shown}"))?;
        idemgate_audit::verify(BufReader::new(file), expect)
    };
    let report = match result {
        Ok(report) => report,
        Err(broken) => {
            eprintln!("idemgate: {shown}: verification failed at {broken}");
            return Ok(ExitCode::from(1));
        }
    };
    if let Some(expected) = args.expect_last
        && report.last_seq != expected
    {
        eprintln!(
            "idemgate: {shown}: the log ends at entry {}, but entry {expected} was expected: \
             {}",
            report.last_seq,
            if report.last_seq < expected {
                "entries were cut from its end (or the export is older)"
            } else {
                "the store has grown since that number was taken"
            }
        );
        return Ok(ExitCode::from(1));
    }
    let what = match expect {
        Expect::SignedBy(key) => format!("every entry signed by {key}"),
        Expect::ChainOnly if report.unsigned > 0 => format!(
            "chain only, {} entries unsigned: nothing proves who wrote them",
            report.unsigned
        ),
        Expect::ChainOnly => "chain only; signatures not checked".into(),
    };
    println!(
        "{shown}: {} entries verified ({what}); the last is entry {}, hash {}",
        report.entries, report.last_seq, report.last_hash
    );
    Ok(ExitCode::SUCCESS)
}
