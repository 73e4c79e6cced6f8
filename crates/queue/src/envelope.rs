//! The job envelope: what a queue message carries so that its consumer can claim the same
//! durable record the rest of idemgate uses.
//!
//! The envelope names the operation by the application's own workflow and step, never by the
//! queue's message id or delivery count: those change on every redelivery, the operation does
//! not. The tenant is not in the envelope either; the consumer's configuration supplies it, as a
//! gateway's token does, so a producer cannot write into another tenant's records.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Largest envelope read, in bytes, unless a consumer is configured otherwise (the gateway's
/// default body bound).
pub const DEFAULT_MAX_BYTES: usize = 256 * 1024;
/// Deepest nesting read, the envelope's own level included (the gateway's default).
pub const DEFAULT_MAX_DEPTH: usize = 32;

/// One job: which tool, with which arguments, for which workflow step.
///
/// ```json
/// {"workflow_id": "order_981", "step_id": "confirmation_email", "tool": "email.send",
///  "arguments": {"to": "ada@example.com", "subject": "Order 981", "body": "…"},
///  "actor": "checkout-service"}
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    /// The application's workflow run: the third part of the operation key.
    pub workflow_id: String,
    /// The step within that run: the fourth part of the operation key.
    pub step_id: String,
    /// The contract's tool name.
    pub tool: String,
    /// The tool's arguments, validated against the contract's input schema.
    pub arguments: Value,
    /// Who asked, recorded with the operation and passed to the authorization hook; the
    /// consumer's default actor when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
}

/// Bounds on what a consumer reads from a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_bytes: usize,
    pub max_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: DEFAULT_MAX_BYTES,
            max_depth: DEFAULT_MAX_DEPTH,
        }
    }
}

impl Limits {
    /// The configuration file's `[limits]` as a consumer reads it: `body_bytes` and
    /// `json_depth` bound an envelope as they bound an HTTP body (the table's other bounds are
    /// other faces'; the HTTP face reads the table strictly).
    pub fn from_file(
        file: &idemgate_app::config::File,
    ) -> Result<Limits, idemgate_app::config::Error> {
        #[derive(serde::Deserialize, Default)]
        #[serde(default)]
        struct Section {
            limits: Table,
        }
        #[derive(serde::Deserialize)]
        #[serde(default)]
        struct Table {
            body_bytes: usize,
            json_depth: usize,
        }
        impl Default for Table {
            fn default() -> Self {
                Table {
                    body_bytes: DEFAULT_MAX_BYTES,
                    json_depth: DEFAULT_MAX_DEPTH,
                }
            }
        }
        let limits = file.section::<Section>()?.limits;
        Ok(Limits {
            max_bytes: limits.body_bytes,
            max_depth: limits.json_depth,
        })
    }
}

/// Why a message is not an envelope. The message names the problem, never the payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("the envelope is {size} bytes, more than the {limit} this consumer reads")]
    TooLarge { size: usize, limit: usize },
    #[error("the envelope is not strict JSON: {0}")]
    NotJson(String),
    #[error("the envelope is not a job envelope: {0}")]
    Shape(String),
}

impl Envelope {
    /// Reads an envelope from a message's payload: bounded in size and depth, strict JSON (no
    /// duplicate member names, no integer beyond ±2^53, as every face of idemgate reads), and
    /// no member beyond the ones above.
    pub fn parse(payload: &[u8], limits: Limits) -> Result<Envelope, Error> {
        if payload.len() > limits.max_bytes {
            return Err(Error::TooLarge {
                size: payload.len(),
                limit: limits.max_bytes,
            });
        }
        let value = idemgate_core::json::parse_with_depth(payload, limits.max_depth)
            .map_err(|e| Error::NotJson(e.message))?;
        if !value.is_object() {
            return Err(Error::Shape("it must be a JSON object".into()));
        }
        serde_json::from_value(value).map_err(|e| Error::Shape(e.to_string()))
    }

    /// The envelope as the bytes a producer publishes.
    pub fn to_bytes(&self) -> Vec<u8> {
        // A struct of strings and a `Value` always serialises.
        serde_json::to_vec(self).expect("an envelope serialises")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(payload: &str, expect: &str) {
        let got = match Envelope::parse(payload.as_bytes(), Limits::default()) {
            Ok(e) => format!("ok {}/{} {}", e.workflow_id, e.step_id, e.tool),
            Err(e) => e.to_string(),
        };
        assert!(
            got.contains(expect),
            "payload {payload}: expected {expect:?}, got {got:?}"
        );
    }

    #[test]
    fn envelopes_read_strictly() {
        check(
            r#"{"workflow_id":"w","step_id":"s","tool":"t","arguments":{}}"#,
            "ok w/s t",
        );
        check(
            r#"{"workflow_id":"w","step_id":"s","tool":"t","arguments":{},"actor":"svc"}"#,
            "ok w/s t",
        );
        check(
            r#"{"step_id":"s","tool":"t","arguments":{}}"#,
            "missing field `workflow_id`",
        );
        check(
            r#"{"workflow_id":"w","step_id":"s","tool":"t","arguments":{},"message_id":"m1"}"#,
            "unknown field `message_id`",
        );
        check(
            r#"{"workflow_id":"w","workflow_id":"v","step_id":"s","tool":"t","arguments":{}}"#,
            "not strict JSON",
        );
        check(
            r#"{"workflow_id":1,"step_id":"s","tool":"t","arguments":{}}"#,
            "invalid type",
        );
        check("not json", "not strict JSON");
        check("[1]", "must be a JSON object");
    }

    #[test]
    fn oversized_envelopes_are_refused_before_parsing() {
        let limits = Limits {
            max_bytes: 10,
            max_depth: 4,
        };
        let e = Envelope::parse(br#"{"workflow_id":"w"}"#, limits).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the envelope is 19 bytes, more than the 10 this consumer reads"
        );
    }

    #[test]
    fn an_envelope_round_trips() {
        let e = Envelope {
            workflow_id: "order_1".into(),
            step_id: "email".into(),
            tool: "email.send".into(),
            arguments: serde_json::json!({"to": "a@b.c"}),
            actor: None,
        };
        assert_eq!(
            Envelope::parse(&e.to_bytes(), Limits::default()).unwrap(),
            e
        );
    }
}
