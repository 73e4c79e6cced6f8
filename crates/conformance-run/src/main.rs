//! `idemgate-conformance`, the fault matrix runner: every scenario of the seed's test tables on
//! embedded SQLite, and the hidden `worker` the crash and multi-process tests start and kill.
//!
//! It is its own binary so that the test-support crate (`idemgate-conformance`) stays out of
//! the shipped `idemgate`; `idemgate conformance …` runs this binary when it sits beside it.
//!
//! Exit statuses: 0 every scenario passed; 1 a scenario failed; 2 the run could not be done.

use std::process::ExitCode;

use clap::Parser;

mod run;

#[derive(Debug, Parser)]
#[command(
    name = "idemgate-conformance",
    version,
    about = "Run idemgate's fault matrix (every scenario of the seed's test tables) on embedded SQLite."
)]
struct Cli {
    #[command(flatten)]
    args: run::ConformanceArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(run::run(cli.args)));
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("idemgate-conformance: {e:#}");
            ExitCode::from(2)
        }
    }
}
