//! `idemgate token new`: mints a bearer token for the gateway and prints it once, with the
//! `[[tenants.tokens]]` lines that `idemgate serve --config` accepts.
//!
//! The token is 32 bytes from the operating system's random source, hex, after `idg_` — the
//! form of the gateway's development tokens. Only its SHA-256 goes into the configuration (the
//! gateway's own `hash_token`), so the file can be read by more people than the token; the token
//! itself is printed here and kept nowhere.

use std::process::ExitCode;

use anyhow::{Context, bail};
use idemgate_server::auth::{Role, hash_token};
use serde::Serialize;

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Mint a token; print it once, and the configuration lines with its hash.
    New(NewArgs),
}

#[derive(Debug, clap::Args)]
pub struct NewArgs {
    /// The tenant the token acts for (the first part of every operation key it makes).
    #[arg(long, value_name = "T")]
    tenant: String,
    /// agent: invoke tools and read its tenant's operations; operator: also list, approve,
    /// deny and reconcile.
    #[arg(long, value_parser = ["agent", "operator"])]
    role: String,
    /// Who holds it: recorded as the actor of what it does.
    #[arg(long, value_name = "N")]
    name: String,
    /// Print one JSON document (token, hash, TOML lines) instead of text.
    #[arg(long)]
    json: bool,
}

/// The configuration's shape for one tenant with one token, serialised by `toml` itself so the
/// lines always parse, whatever the names hold.
#[derive(Serialize)]
struct Lines<'a> {
    tenants: [TenantLines<'a>; 1],
}

#[derive(Serialize)]
struct TenantLines<'a> {
    name: &'a str,
    tokens: [TokenLines<'a>; 1],
}

#[derive(Serialize)]
struct TokenLines<'a> {
    name: &'a str,
    sha256: &'a str,
    role: &'a str,
}

pub fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::New(args) => new(args),
    }
}

fn new(args: NewArgs) -> anyhow::Result<ExitCode> {
    check_tenant(&args.tenant)?;
    let name = args.name.trim();
    if name.is_empty() || name.chars().any(char::is_control) {
        bail!("--name must be a non-empty name without control characters");
    }
    let role = match args.role.as_str() {
        "agent" => Role::Agent,
        "operator" => Role::Operator,
        other => bail!("--role is agent or operator, not {other:?}"),
    };
    let token = mint()?;
    let sha256 = hash_token(&token);
    let toml = toml::to_string(&Lines {
        tenants: [TenantLines {
            name: &args.tenant,
            tokens: [TokenLines {
                name,
                sha256: &sha256,
                role: role.as_str(),
            }],
        }],
    })
    .context("writing the configuration lines")?;
    if args.json {
        let doc = serde_json::json!({
            "token": token,
            "tenant": args.tenant,
            "name": name,
            "role": role.as_str(),
            "sha256": sha256,
            "toml": toml,
        });
        println!("{doc}");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "token for tenant {}, role {role}, held by {name} (shown only now; it is kept nowhere):",
        args.tenant
    );
    println!();
    println!("  {token}");
    println!();
    // The lines below the token are TOML as a whole, comments included: paste them as they are.
    println!("# For the configuration of `idemgate serve --config`. A tenant already configured");
    println!("# takes only the [[tenants.tokens]] table, under its own [[tenants]] entry.");
    print!("{toml}");
    Ok(ExitCode::SUCCESS)
}

/// The same rule as the gateway's configuration: printable ASCII without spaces or `:`, since
/// the tenant is part of every operation key.
fn check_tenant(tenant: &str) -> anyhow::Result<()> {
    if tenant.is_empty()
        || !tenant
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b) && b != b':')
    {
        bail!(
            "--tenant {tenant:?} must be printable ASCII without spaces or `:` (it is part of \
             every operation key)"
        );
    }
    Ok(())
}

/// A fresh token: `idg_` and 64 hex digits from the operating system's random source. There
/// is no fallback: without that source no token is minted.
fn mint() -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| anyhow::anyhow!("the operating system's random source failed: {e}"))?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("idg_{hex}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_tokens_have_the_development_form_and_differ() {
        let a = mint().unwrap();
        let b = mint().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.len(), 4 + 64);
        assert!(a.starts_with("idg_"));
        assert!(
            a[4..]
                .bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
    }

    #[test]
    fn tenants_follow_the_configuration_rule() {
        for ok in ["acme", "team-7", "a.b_c"] {
            assert!(check_tenant(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a b", "a:b", "é", "tab\t"] {
            assert!(check_tenant(bad).is_err(), "{bad:?}");
        }
    }
}
