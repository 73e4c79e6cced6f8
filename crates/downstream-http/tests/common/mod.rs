//! Contracts and requests shared by the over-the-wire tests.
#![allow(dead_code)]

use std::time::Duration;

use idemgate_core::contract::Contract;
use idemgate_core::effect::EffectRequest;
use idemgate_core::key::OperationKey;
use serde_json::{Value, json};

/// Every test's upper bound: a client timeout or a fault that fails to fire fails the test
/// instead of hanging the run.
pub const TEST_LIMIT: Duration = Duration::from_secs(20);

pub async fn bounded<F: IntoFuture>(future: F) -> F::Output {
    tokio::time::timeout(TEST_LIMIT, future)
        .await
        .expect("the test finished within its bound")
}

/// A key-based ticket contract whose downstream lives at `base` (`http://127.0.0.1:port`).
/// `downstream` is the YAML under `downstream:` after the `http:` URL lines, indented by four.
pub fn tickets(base: &str, dedup: bool, lookup: bool, total_timeout: &str) -> Contract {
    let lookup_section = if lookup {
        format!("\n    lookup:\n      url: {base}/tickets/by-key/{{operation_key}}")
    } else {
        String::new()
    };
    load(&format!(
        r#"name: tickets.create
version: "1"
purpose: Create one support ticket.
effect_class: key_based
input_schema:
  type: object
  properties:
    queue_id: {{type: string}}
    subject: {{type: string}}
    body: {{type: string}}
  required: [subject]
  additionalProperties: false
request_fingerprint:
  fields: [queue_id, subject, body]
downstream:
  deduplicates_by_key: {dedup}
  receipt_lookup: {lookup}
  http:
    url: {base}/tickets
    reference: /ticket_id
    error_message: /error
    headers: {{X-Client: idemgate-tests}}
    timeouts: {{connect: 1s, total: {total_timeout}}}{lookup_section}
retention:
  record_ttl: 1h
  tombstone_ttl: 1d
  max_retry_window: 1h
"#
    ))
}

pub fn load(yaml: &str) -> Contract {
    Contract::load(yaml, "test.yaml").unwrap_or_else(|e| panic!("contract does not load: {e}"))
}

pub fn key(step: &str) -> OperationKey {
    OperationKey::new("acme", "test", "run_827", step).unwrap()
}

pub fn ticket_args() -> Value {
    json!({"queue_id": "support", "subject": "Printer on fire", "body": "Third floor."})
}

pub fn request<'a>(key: &'a OperationKey, arguments: &'a Value) -> EffectRequest<'a> {
    EffectRequest {
        key,
        tool: "tickets.create",
        tool_version: "1",
        arguments,
        attempt: 1,
        precondition: None,
    }
}
