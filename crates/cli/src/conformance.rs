//! `idemgate conformance …`: runs the fault matrix runner, the `idemgate-conformance` binary
//! beside this one, with the same arguments. The runner is built from the workspace
//! (`cargo build -p idemgate-conformance-run`, or `cargo run -p idemgate-conformance-run`
//! directly); it is a binary of its own so that the test-support crate is not linked into
//! `idemgate`.

use std::ffi::OsString;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

/// The runner's executable name.
pub const RUNNER: &str = "idemgate-conformance";

#[derive(Debug, Args)]
pub struct ConformanceArgs {
    /// The runner's arguments: `--list`, `--only TEXT` (see `idemgate-conformance --help`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<OsString>,
}

pub fn run(args: ConformanceArgs) -> anyhow::Result<ExitCode> {
    let me = std::env::current_exe().context("finding the idemgate executable")?;
    let runner = me.with_file_name(format!("{RUNNER}{}", std::env::consts::EXE_SUFFIX));
    if !runner.is_file() {
        anyhow::bail!(
            "the fault matrix runner `{RUNNER}` is not beside {} (it is not part of the \
             shipped binary); build it with `cargo build -p idemgate-conformance-run`, or run \
             `cargo run -p idemgate-conformance-run --` with the same arguments",
            me.display()
        );
    }
    let status = std::process::Command::new(&runner)
        .args(&args.args)
        .status()
        .with_context(|| format!("running {}", runner.display()))?;
    Ok(match status.code() {
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(2)),
        None => ExitCode::from(2),
    })
}
