//! Operation keys for hosts that cannot send `_meta` (DESIGN §6), as plain functions.
//!
//! Under [`Identity::SessionWindow`] a key-based call without `_meta` gets a key derived from
//! who calls (tenant and actor), the MCP session where the transport has one, the tool and the
//! request fingerprint. A repeat of the same call within the window of the operation's first
//! call is the same operation and replays; after the window it is a new one.
//!
//! **The window is anchored at the operation's first call**, not at fixed clock intervals.
//! Fixed intervals alone would split a repeat that straddles a boundary (a call at 09:59:59 and
//! its retry at 10:00:01 would be two operations). Instead the key carries the interval number
//! of its first call (`interval = now / window`), and a call looks at the *previous* interval's
//! key first: if a record is there and was created less than one window ago, the call is that
//! operation; otherwise it is the current interval's key, which is found or claimed atomically
//! by the store. A record created less than one window ago can only sit under the current or
//! the previous interval's key, so two reads at most decide, and two concurrent first calls
//! derive the same key — the store's unique key, not this module, resolves their race.
//!
//! A deliberate repeat names the earlier operation in the `repeat_of` argument; its key is
//! derived from that operation's key (and the fingerprint), so a lost answer of the repeat,
//! re-sent, replays the repeat instead of making a third effect. Another repeat names the
//! repeat's key.
//!
//! Keys keep the shape `tenant:environment:workflow_id:step_id`: the workflow is
//! `mcp-<16 hex of the session>`, the step `<tool>-<16 hex of tool and fingerprint>-<window>s<interval>`
//! (or `…-r<16 hex of the repeated key>` for a deliberate repeat). The tool part is cut to fit
//! [`MAX_KEY_BYTES`]; the hashes keep the key unique.

use idemgate_core::contract::Identity;
use idemgate_core::duration::Span;
use idemgate_core::fingerprint::Fingerprint;
use idemgate_core::key::{self, MAX_KEY_BYTES, OperationKey};
use idemgate_core::outcome::{ErrorCode, Outcome};
use idemgate_core::record::{Millis, Record};
use sha2::{Digest, Sha256};

/// The argument with which a model asks for a deliberate new operation.
pub const REPEAT_OF: &str = "repeat_of";

/// The longest tool part of a derived step; the rest of the step is hashes.
const MAX_TOOL_PART: usize = 64;

/// Who calls, and in which MCP session, for a derived key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal<'a> {
    pub tenant: &'a str,
    pub actor: &'a str,
    /// The MCP session: the streamable-HTTP session id, or the stdio connection's own id.
    /// `None` where the transport has none (stateless streamable HTTP).
    pub session: Option<&'a str>,
}

/// Which rule made the key of a call; every answer says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// The agent runtime named the operation in `_meta`.
    Meta,
    /// Derived: the same call within `window` of the operation's first call.
    SessionWindow { window: Span },
    /// Derived from `repeat_of`: a deliberate new operation after `of`.
    RepeatOf { of: OperationKey, window: Span },
}

impl Rule {
    /// The sentence appended to an answer's text: which rule made the key, and what calling
    /// again does. `key` is the operation key of the answer, when it has one.
    pub fn sentence(&self, key: Option<&OperationKey>) -> String {
        let again = |key: Option<&OperationKey>| match key {
            Some(k) => format!(
                " Only if the user wants it done once more, call again with repeat_of \"{k}\"."
            ),
            None => String::new(),
        };
        match self {
            Rule::Meta => {
                "Key rule: meta — the application running you named this operation.".to_string()
            }
            Rule::SessionWindow { window } => format!(
                "Key rule: session_window — the same call with the same arguments within {window} of the first is this same operation and runs no new effect.{}",
                again(key)
            ),
            Rule::RepeatOf { of, .. } => format!(
                "Key rule: repeat_of — a deliberate repeat of {of}; sending this same repeat again runs no new effect.{}",
                again(key)
            ),
        }
    }

    /// The rule as data, for the result's `_meta`.
    pub fn as_json(&self) -> serde_json::Value {
        match self {
            Rule::Meta => serde_json::json!({"rule": "meta"}),
            Rule::SessionWindow { window } => {
                serde_json::json!({"rule": "session_window", "window_seconds": window.seconds()})
            }
            Rule::RepeatOf { of, window } => serde_json::json!({
                "rule": "repeat_of",
                "repeat_of": of.as_str(),
                "window_seconds": window.seconds(),
            }),
        }
    }
}

fn hex16(parts: &[&str]) -> String {
    let mut hash = Sha256::new();
    // A versioned domain tag, then each part length-prefixed: no two part lists hash alike.
    hash.update(b"idemgate/mcp-identity/v1");
    for part in parts {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    hash.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The workflow part of a derived key: one per (tenant, actor, session).
pub fn workflow_id(principal: &Principal<'_>) -> String {
    let session = principal.session.unwrap_or("");
    format!(
        "mcp-{}",
        hex16(&[
            "session",
            principal.tenant,
            principal.actor,
            session,
            if principal.session.is_some() {
                "1"
            } else {
                "0"
            }
        ])
    )
}

fn step_id(
    tenant: &str,
    environment: &str,
    workflow: &str,
    tool: &str,
    hash: &str,
    suffix: &str,
) -> String {
    // The fixed parts: three separators, `-hash-suffix`.
    let fixed = tenant.len() + environment.len() + workflow.len() + 3 + 1 + hash.len() + 1;
    let budget = MAX_KEY_BYTES
        .saturating_sub(fixed + suffix.len())
        .saturating_sub(1)
        .min(MAX_TOOL_PART);
    // Contract names are ASCII, so a byte cut is a character cut.
    let tool: String = tool.chars().take(budget).collect();
    if tool.is_empty() {
        format!("{hash}-{suffix}")
    } else {
        format!("{tool}-{hash}-{suffix}")
    }
}

/// The two keys a windowed call may be: the previous interval's (an operation whose first
/// call may still be within the window) and the current interval's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Windowed {
    pub previous: OperationKey,
    pub current: OperationKey,
}

/// The interval of `now` for `window` (whole seconds, at least one).
fn interval(window: Span, now: Millis) -> i64 {
    let len = window.millis().max(1000);
    now.div_euclid(len)
}

/// The candidate keys of a call under `session_window` at `now`.
pub fn windowed(
    environment: &str,
    principal: &Principal<'_>,
    tool: &str,
    fingerprint: &Fingerprint,
    window: Span,
    now: Millis,
) -> Result<Windowed, key::Error> {
    let at = interval(window, now);
    let key = |n: i64| {
        derived(
            environment,
            principal,
            tool,
            fingerprint,
            &format!("{}s{n}", window.seconds()),
        )
    };
    Ok(Windowed {
        previous: key(at - 1)?,
        current: key(at)?,
    })
}

/// The derived key of a call, ending in `suffix` (the interval, or the repeated key's hash).
fn derived(
    environment: &str,
    principal: &Principal<'_>,
    tool: &str,
    fingerprint: &Fingerprint,
    suffix: &str,
) -> Result<OperationKey, key::Error> {
    let workflow = workflow_id(principal);
    let hash = hex16(&["call", tool, fingerprint.as_str()]);
    let step = step_id(
        principal.tenant,
        environment,
        &workflow,
        tool,
        &hash,
        suffix,
    );
    OperationKey::new(principal.tenant, environment, &workflow, &step)
}

/// Whether a call at `now` is the operation found under the previous interval's key: it was
/// first called less than one window ago.
pub fn within_window(previous: &Record, window: Span, now: Millis) -> bool {
    now.saturating_sub(previous.created_at) < window.millis()
}

/// The key of a deliberate repeat of `of`.
pub fn repeat(
    environment: &str,
    principal: &Principal<'_>,
    tool: &str,
    fingerprint: &Fingerprint,
    of: &OperationKey,
) -> Result<OperationKey, key::Error> {
    let suffix = format!("r{}", hex16(&["repeat", of.as_str()]));
    derived(environment, principal, tool, fingerprint, &suffix)
}

/// Why a `repeat_of` was refused; nothing was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepeatRefused {
    /// Not a string.
    NotText,
    /// Not an operation key.
    Malformed(String),
    /// No operation of this caller (tenant, environment and actor) made with this tool. One
    /// answer for a missing key, another tenant's, another actor's and another tool's, so a
    /// refusal tells nothing about operations that are not the caller's.
    NotYours,
}

impl RepeatRefused {
    pub fn outcome(&self, tool: &str) -> Outcome {
        let message = match self {
            RepeatRefused::NotText => format!(
                "{REPEAT_OF} must be a string: the operation_key of an earlier answer of {tool}"
            ),
            RepeatRefused::Malformed(e) => format!("{REPEAT_OF} is not an operation key: {e}"),
            RepeatRefused::NotYours => format!(
                "{REPEAT_OF} names no operation of this caller made with {tool}; pass the operation_key an earlier answer of {tool} returned, or leave {REPEAT_OF} out"
            ),
        };
        // The call was not run, under no key of its own: a refusal of the identity it asked for.
        Outcome::refused(
            idemgate_core::outcome::Repeatable::unnamed(),
            ErrorCode::InvalidOperationKey,
            message,
        )
    }
}

/// Checks that `record` (read under the `repeat_of` key) is an operation of this caller and
/// tool.
pub fn check_repeat(
    record: Option<&Record>,
    principal: &Principal<'_>,
    environment: &str,
    tool: &str,
) -> Result<(), RepeatRefused> {
    match record {
        Some(r)
            if r.key.tenant() == principal.tenant
                && r.key.environment() == environment
                && r.actor == principal.actor
                && r.tool == tool =>
        {
            Ok(())
        }
        _ => Err(RepeatRefused::NotYours),
    }
}

/// Reads a `repeat_of` argument's value.
pub fn parse_repeat(value: &serde_json::Value) -> Result<OperationKey, RepeatRefused> {
    let text = value.as_str().ok_or(RepeatRefused::NotText)?;
    OperationKey::parse(text).map_err(|e| RepeatRefused::Malformed(e.to_string()))
}

/// The identity rule of one tool: its contract's, else the server's.
pub fn effective(contract: Option<Identity>, server: Identity) -> Identity {
    contract.unwrap_or(server)
}

#[cfg(test)]
mod tests {
    use super::*;
    use idemgate_core::contract::Contract;
    use idemgate_core::record::{Dispatch, Lease, NOT_SETTLED, RecordState};
    use serde_json::json;

    fn fp(value: &str) -> Fingerprint {
        let c = Contract::load(
            include_str!("../../../contracts/tickets.create.yaml"),
            "tickets.create.yaml",
        )
        .unwrap();
        let args = json!({"subject": value, "body": "b"});
        c.fingerprint(&args).unwrap()
    }

    fn me(session: Option<&'static str>) -> Principal<'static> {
        Principal {
            tenant: "acme",
            actor: "alice",
            session,
        }
    }

    const TEN_MINUTES: Span = Span(600);

    fn keys(principal: &Principal<'_>, title: &str, now: Millis) -> Windowed {
        windowed(
            "prod",
            principal,
            "tickets.create",
            &fp(title),
            TEN_MINUTES,
            now,
        )
        .unwrap()
    }

    #[test]
    fn a_derived_key_has_the_four_parts_and_names_the_tool() {
        let w = keys(&me(Some("s1")), "printer", 1_000_000_000);
        let k = &w.current;
        assert_eq!((k.tenant(), k.environment()), ("acme", "prod"));
        assert!(k.workflow_id().starts_with("mcp-"), "{k}");
        assert_eq!(k.workflow_id().len(), 4 + 16, "{k}");
        assert!(k.step_id().starts_with("tickets.create-"), "{k}");
        assert!(
            k.step_id()
                .ends_with(&format!("-600s{}", 1_000_000_000 / 600_000)),
            "{k}"
        );
        assert_eq!(OperationKey::parse(k.as_str()).as_ref(), Ok(k));
    }

    #[test]
    fn the_same_call_is_the_same_key_and_anything_else_is_not() {
        let now = 1_000_000_000;
        let base = keys(&me(Some("s1")), "printer", now);
        // Later in the same interval: the same candidates.
        assert_eq!(keys(&me(Some("s1")), "printer", now + 1), base);
        for (what, other) in [
            ("another fingerprint", keys(&me(Some("s1")), "toner", now)),
            ("another session", keys(&me(Some("s2")), "printer", now)),
            ("no session", keys(&me(None), "printer", now)),
            (
                "another actor",
                keys(
                    &Principal {
                        actor: "bob",
                        ..me(Some("s1"))
                    },
                    "printer",
                    now,
                ),
            ),
            (
                "another tenant",
                keys(
                    &Principal {
                        tenant: "beta",
                        ..me(Some("s1"))
                    },
                    "printer",
                    now,
                ),
            ),
        ] {
            assert_ne!(other.current, base.current, "{what}");
            assert_ne!(other.previous, base.current, "{what}");
        }
        let other_tool = windowed(
            "prod",
            &me(Some("s1")),
            "tickets.close",
            &fp("printer"),
            TEN_MINUTES,
            now,
        )
        .unwrap();
        assert_ne!(other_tool.current, base.current);
        let other_window = windowed(
            "prod",
            &me(Some("s1")),
            "tickets.create",
            &fp("printer"),
            Span(60),
            now,
        )
        .unwrap();
        assert_ne!(
            other_window.current, base.current,
            "a new window length is a new key"
        );
    }

    fn record_at(key: &OperationKey, created_at: Millis) -> Record {
        Record {
            key: key.clone(),
            tool: "tickets.create".into(),
            tool_version: "1".into(),
            fingerprint: fp("printer"),
            canonicalization: 1,
            state: RecordState::Pending {
                lease: Lease {
                    owner: Some("w".into()),
                    expires_at: created_at + 30_000,
                },
                dispatch: Dispatch::NotSent,
            },
            fence: 1,
            actor: "alice".into(),
            request: None,
            approved_by: None,
            created_at,
            updated_at: created_at,
            expires_at: NOT_SETTLED,
            purge_at: NOT_SETTLED,
            intent_window: false,
        }
    }

    /// The window is anchored at the first call: a repeat that crosses an interval boundary
    /// finds the first call's key as the previous interval's; one window after the first call
    /// it is a new operation.
    #[test]
    fn the_window_is_anchored_at_the_first_call_not_at_interval_boundaries() {
        let len = TEN_MINUTES.millis();
        let first = 7 * len + len - 1_000; // one second before a boundary
        let at_first = keys(&me(Some("s1")), "printer", first);
        let record = record_at(&at_first.current, first);
        // Two seconds later, across the boundary: the previous interval's key is the first
        // call's, and it is within the window.
        let repeat = keys(&me(Some("s1")), "printer", first + 2_000);
        assert_eq!(repeat.previous, at_first.current);
        assert!(within_window(&record, TEN_MINUTES, first + 2_000));
        // Just under one window later: still the same operation.
        assert!(within_window(&record, TEN_MINUTES, first + len - 1));
        let late = keys(&me(Some("s1")), "printer", first + len - 1);
        assert_eq!(late.previous, at_first.current);
        // One window after the first call: a new operation, under the current interval's key.
        assert!(!within_window(&record, TEN_MINUTES, first + len));
        let after = keys(&me(Some("s1")), "printer", first + len);
        assert_ne!(after.current, at_first.current);
    }

    #[test]
    fn a_repeat_key_is_stable_new_and_chains() {
        let now = 1_000_000_000;
        let first = keys(&me(Some("s1")), "printer", now).current;
        let f = fp("printer");
        let again = repeat("prod", &me(Some("s1")), "tickets.create", &f, &first).unwrap();
        assert_eq!(
            repeat("prod", &me(Some("s1")), "tickets.create", &f, &first).unwrap(),
            again,
            "a re-sent repeat is the same operation"
        );
        assert_ne!(again, first);
        let third = repeat("prod", &me(Some("s1")), "tickets.create", &f, &again).unwrap();
        assert_ne!(third, again);
        assert_ne!(third, first);
        assert!(again.step_id().contains("-r"), "{again}");
    }

    #[test]
    fn long_tenants_and_tools_still_fit_the_key() {
        let tenant = "t".repeat(100);
        let env = "e".repeat(60);
        let principal = Principal {
            tenant: &tenant,
            actor: "a",
            session: Some("s"),
        };
        let tool = "x".repeat(128);
        let w = windowed(
            &env,
            &principal,
            &tool,
            &fp("a"),
            Span(86_400 * 365),
            i64::MAX / 2,
        )
        .unwrap();
        assert!(w.current.as_str().len() <= MAX_KEY_BYTES, "{}", w.current);
        let r = repeat(&env, &principal, &tool, &fp("a"), &w.current).unwrap();
        assert!(r.as_str().len() <= MAX_KEY_BYTES, "{r}");
        // Two tools that share a long prefix still get distinct keys (the hash covers the
        // whole name).
        let tool2 = format!("{}y", "x".repeat(127));
        let w2 = windowed(
            &env,
            &principal,
            &tool2,
            &fp("a"),
            Span(86_400 * 365),
            i64::MAX / 2,
        )
        .unwrap();
        assert_ne!(w2.current, w.current);
    }

    #[test]
    fn repeat_of_must_be_an_operation_of_this_caller_and_tool() {
        let key = OperationKey::parse("acme:prod:mcp-0123456789abcdef:tickets.create-x").unwrap();
        let mut mine = record_at(&key, 0);
        mine.tool = "tickets.create".into();
        mine.actor = "alice".into();
        let p = me(Some("s1"));
        assert_eq!(
            check_repeat(Some(&mine), &p, "prod", "tickets.create"),
            Ok(())
        );
        // Another session of the same principal may repeat it.
        assert_eq!(
            check_repeat(Some(&mine), &me(None), "prod", "tickets.create"),
            Ok(())
        );
        let bob = Principal {
            actor: "bob",
            ..p.clone()
        };
        let beta = Principal {
            tenant: "beta",
            ..p.clone()
        };
        for (what, record, principal, environment, tool) in [
            ("missing", None, &p, "prod", "tickets.create"),
            ("another tool", Some(&mine), &p, "prod", "tickets.close"),
            (
                "another environment",
                Some(&mine),
                &p,
                "staging",
                "tickets.create",
            ),
            ("another actor", Some(&mine), &bob, "prod", "tickets.create"),
            (
                "another tenant",
                Some(&mine),
                &beta,
                "prod",
                "tickets.create",
            ),
        ] {
            assert_eq!(
                check_repeat(record, principal, environment, tool),
                Err(RepeatRefused::NotYours),
                "{what}"
            );
        }
        assert_eq!(parse_repeat(&json!(7)), Err(RepeatRefused::NotText));
        assert!(matches!(
            parse_repeat(&json!("a:b")),
            Err(RepeatRefused::Malformed(_))
        ));
        let o = RepeatRefused::NotYours.outcome("tickets_create");
        assert_eq!(o.error_code(), Some(ErrorCode::InvalidOperationKey));
    }

    #[test]
    fn the_rule_sentence_says_what_a_repeat_means() {
        let key = OperationKey::parse("acme:prod:w:s").unwrap();
        let s = Rule::SessionWindow {
            window: TEN_MINUTES,
        }
        .sentence(Some(&key));
        assert_eq!(
            s,
            "Key rule: session_window — the same call with the same arguments within 10m of the first is this same operation and runs no new effect. Only if the user wants it done once more, call again with repeat_of \"acme:prod:w:s\"."
        );
        let r = Rule::RepeatOf {
            of: key.clone(),
            window: TEN_MINUTES,
        }
        .sentence(Some(&key));
        assert!(
            r.starts_with("Key rule: repeat_of — a deliberate repeat of acme:prod:w:s"),
            "{r}"
        );
        assert_eq!(
            Rule::Meta.sentence(Some(&key)),
            "Key rule: meta — the application running you named this operation."
        );
    }
}
