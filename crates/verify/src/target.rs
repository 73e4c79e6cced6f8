//! [`Target`]: one contract made ready to verify — read and checked as `serve` would load it,
//! its downstream's URLs moved to the base URL the user named, and the arguments every probe
//! sends.
//!
//! **Nothing touches production unless the user points it there.** A contract's URLs name
//! the system of record it runs against in production. Without `--base-url`, a contract whose
//! effect URL is not on a loopback address is refused; with it, every URL of the contract on
//! the effect URL's origin (the lookup, the job poll, the authorization hook when they share
//! it) moves to the base URL, whose path, if any, goes before each URL's own path. URLs on
//! another origin are left as written, and the plan printed before the first effect names them.

use std::path::Path;

use idemgate_core::contract::{Contract, ContractFile, EffectClass};
use idemgate_core::effect::Downstream as _;
use idemgate_downstream_http::HttpDownstream;
use serde_json::Value;

use crate::Error;

/// One contract, ready to verify.
#[derive(Debug)]
pub struct Target {
    /// The file as named on the command line.
    pub file: String,
    /// The contract as written, for the declared claims and the decision.
    pub written: ContractFile,
    /// The contract with its URLs moved to the target base.
    pub contract: Contract,
    /// `scheme://host[:port][/prefix]` every URL on the effect's origin now starts with.
    pub base: String,
    /// The effect's URL template, on the target base.
    pub effect_url: String,
    /// The authorization hook's URL, where the contract names one.
    pub hook_url: Option<String>,
    /// URLs of the contract left on an origin of their own (named in the plan).
    pub elsewhere: Vec<String>,
    /// The arguments every probe sends (a probe that changes a material field changes a copy).
    pub arguments: Value,
}

impl Target {
    /// Reads the contract at `path`, moves its URLs to `base_url` (or refuses one that is not
    /// on loopback when there is none), and checks `arguments` against it (made from the
    /// input schema when `None`, see [`crate::sample`]).
    pub fn load(
        path: &Path,
        base_url: Option<&str>,
        arguments: Option<Value>,
        run: &str,
    ) -> Result<Target, Error> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| Error::Read {
            file: file.clone(),
            message: e.to_string(),
        })?;
        let contract = Contract::load(&text, &file).map_err(Error::Contract)?;
        if contract.effect_class == EffectClass::Read {
            return Err(Error::Unsupported {
                file,
                reason: "it is a read: there is no effect whose claims could be checked".into(),
            });
        }
        let written = contract.file.clone();
        let effect_url = http_field(&written, &["url"]).ok_or_else(|| Error::Unsupported {
            file: file.clone(),
            reason:
                "it has no `downstream.http` section: verify runs the contract's HTTP downstream"
                    .into(),
        })?;
        let (origin, _) = split_origin(&effect_url).ok_or_else(|| Error::Unsupported {
            file: file.clone(),
            reason: "`downstream.http.url` is not an http or https URL".into(),
        })?;
        let base = match base_url {
            Some(url) => check_base(url)?,
            None if is_loopback(&origin) => origin.clone(),
            None => {
                return Err(Error::NotLoopback { file, origin });
            }
        };
        let moved = rebase_contract(&written, &origin, &base);
        let contract = Contract::from_file(moved.clone(), &text, &file).map_err(Error::Contract)?;
        let downstream = HttpDownstream::from_contract(&contract).map_err(|e| Error::Http {
            file: file.clone(),
            message: e.to_string(),
        })?;
        let arguments = match arguments {
            Some(arguments) => arguments,
            None => {
                crate::sample::arguments(&contract, run).map_err(|message| Error::Arguments {
                    tool: contract.name.clone(),
                    message,
                })?
            }
        };
        let refuse = |message: String| Error::Arguments {
            tool: contract.name.clone(),
            message,
        };
        contract.validate(&arguments).map_err(|e| {
            refuse(format!(
                "the arguments do not fit the input schema: {}",
                e.message
            ))
        })?;
        downstream.check(&arguments).map_err(refuse)?;
        let mut elsewhere = Vec::new();
        for path in [&["lookup", "url"][..], &["job", "poll_url"][..]] {
            if let Some(url) = http_field(&moved, path)
                && !url.starts_with(&base)
            {
                elsewhere.push(url);
            }
        }
        let hook_url = hook_field(&moved);
        if let Some(url) = &hook_url
            && !url.starts_with(&base)
        {
            elsewhere.push(url.clone());
        }
        Ok(Target {
            file,
            written,
            effect_url: http_field(&moved, &["url"]).unwrap_or_default(),
            contract,
            base,
            hook_url,
            elsewhere,
            arguments,
        })
    }

    pub fn tool(&self) -> &str {
        &self.contract.name
    }

    /// The contract with every URL on the target base moved to `to` (the verification's own
    /// proxy), ready to build the executor's tool from.
    pub fn contract_via(&self, to: &str) -> Result<Contract, Error> {
        let moved = rebase_contract(&self.contract.file, &self.base, to);
        // The text only locates errors by line; these URLs were checked when the target loaded.
        Contract::from_file(moved, "", &self.file).map_err(Error::Contract)
    }
}

/// A string field of `downstream.http` at `path`.
fn http_field(cf: &ContractFile, path: &[&str]) -> Option<String> {
    let mut at = cf.downstream.http.as_ref()?;
    for part in path {
        at = at.get(part)?;
    }
    at.as_str().map(str::to_string)
}

fn hook_field(cf: &ContractFile) -> Option<String> {
    cf.security
        .authorization_hook
        .as_ref()?
        .get("url")?
        .as_str()
        .map(str::to_string)
}

/// Every URL of the contract that starts with `from` (the effect's origin, say) moved to `to`.
fn rebase_contract(cf: &ContractFile, from: &str, to: &str) -> ContractFile {
    let mut cf = cf.clone();
    if let Some(http) = cf.downstream.http.as_mut() {
        for path in [
            &["url"][..],
            &["lookup", "url"][..],
            &["job", "poll_url"][..],
        ] {
            rebase_at(http, path, from, to);
        }
    }
    if let Some(hook) = cf.security.authorization_hook.as_mut() {
        rebase_at(hook, &["url"], from, to);
    }
    cf
}

fn rebase_at(value: &mut Value, path: &[&str], from: &str, to: &str) {
    let mut at = value;
    for part in path {
        match at.get_mut(part) {
            Some(next) => at = next,
            None => return,
        }
    }
    if let Some(url) = at.as_str()
        && let Some(moved) = rebase(url, from, to)
    {
        *at = Value::String(moved);
    }
}

/// `url` with its leading `from` replaced by `to`, when it starts with `from` followed by a
/// path, a query or nothing. Scheme and host compare without regard to case.
pub(crate) fn rebase(url: &str, from: &str, to: &str) -> Option<String> {
    let head = url.get(..from.len())?;
    if !head.eq_ignore_ascii_case(from) {
        return None;
    }
    let rest = &url[from.len()..];
    if !(rest.is_empty() || rest.starts_with('/') || rest.starts_with('?')) {
        return None;
    }
    Some(format!("{to}{rest}"))
}

/// `(scheme://authority, rest)` of an http or https URL (template), lowercased origin.
pub(crate) fn split_origin(url: &str) -> Option<(String, String)> {
    let (scheme, after) = url.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "http" && scheme != "https" {
        return None;
    }
    let end = after.find(['/', '?', '#']).unwrap_or(after.len());
    let authority = &after[..end];
    if authority.is_empty() || authority.contains('{') {
        return None;
    }
    Some((
        format!("{scheme}://{}", authority.to_ascii_lowercase()),
        after[end..].to_string(),
    ))
}

/// A base URL as `--base-url` gives it: http or https, a host, an optional path prefix, no
/// query; without its trailing `/`.
fn check_base(url: &str) -> Result<String, Error> {
    let bad = |reason: &str| Error::BaseUrl(format!("`{url}` {reason}"));
    let (origin, rest) =
        split_origin(url).ok_or_else(|| bad("is not an http or https URL with a host"))?;
    if rest.contains(['?', '#', '{']) {
        return Err(bad(
            "has a query, a fragment or a placeholder; give the scheme, host and an optional path prefix",
        ));
    }
    Ok(format!("{origin}{}", rest.trim_end_matches('/')))
}

/// Whether an origin's host is a loopback address: `localhost`, `127.0.0.0/8` or `[::1]`.
pub(crate) fn is_loopback(origin: &str) -> bool {
    let authority = origin.split_once("://").map_or(origin, |(_, a)| a);
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_and_rebasing() {
        assert_eq!(
            split_origin("HTTPS://API.Example.com:8443/v1/tickets?x={a}"),
            Some((
                "https://api.example.com:8443".into(),
                "/v1/tickets?x={a}".into()
            ))
        );
        assert_eq!(split_origin("ftp://x/y"), None);
        assert_eq!(split_origin("http:///y"), None);
        let from = "https://api.example.com";
        let to = "http://127.0.0.1:4000/prefix";
        assert_eq!(
            rebase("https://API.example.com/tickets/{operation_key}", from, to).as_deref(),
            Some("http://127.0.0.1:4000/prefix/tickets/{operation_key}")
        );
        assert_eq!(rebase("https://api.example.com.evil/x", from, to), None);
        assert_eq!(rebase("https://other.example.com/x", from, to), None);
        assert_eq!(rebase(from, from, to).as_deref(), Some(to));
    }

    #[test]
    fn loopback_hosts() {
        for origin in [
            "http://127.0.0.1:9000",
            "http://localhost",
            "http://[::1]:80",
            "https://127.1.2.3",
        ] {
            assert!(is_loopback(origin), "{origin}");
        }
        for origin in [
            "https://api.example.com",
            "http://10.0.0.1:80",
            "http://localhost.example",
        ] {
            assert!(!is_loopback(origin), "{origin}");
        }
    }

    #[test]
    fn base_urls() {
        assert_eq!(
            check_base("https://staging.example/api/").unwrap(),
            "https://staging.example/api"
        );
        assert!(check_base("staging.example").is_err());
        assert!(check_base("https://staging.example/?a=1").is_err());
    }
}
