//! Traces as a collector receives them: `idemgate serve` with `OTEL_EXPORTER_OTLP_ENDPOINT`
//! exports over OTLP/HTTP to a receiver inside this test, which decodes the protobuf. One
//! delivery is a span under the caller's `traceparent`, with the claim, the authorization hook,
//! the downstream call and the finalising write as its children; the downstream and the hook
//! receive a `traceparent` naming the span that called them.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{HttpServer, Received, Serve};
use idemgate_server::auth::hash_token;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

const TOKEN: &str = "traces-test-agent-token";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

fn system_of_record(r: &Received) -> (u16, String) {
    match (r.method.as_str(), r.path.as_str()) {
        ("POST", "/auth") => (200, r#"{"allow": true}"#.into()),
        ("POST", "/tickets") => (201, r#"{"ticket_id": "ticket_77"}"#.into()),
        _ => (404, r#"{"error": "no such route"}"#.into()),
    }
}

fn collector(_: &Received) -> (u16, String) {
    (200, String::new())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    let value = span
        .attributes
        .iter()
        .find(|a| a.key == key)?
        .value
        .as_ref()?;
    match value.value.as_ref()? {
        Any::StringValue(s) => Some(s.clone()),
        Any::IntValue(i) => Some(i.to_string()),
        Any::BoolValue(b) => Some(b.to_string()),
        other => Some(format!("{other:?}")),
    }
}

fn contract(sor: &str) -> String {
    format!(
        r#"name: tickets.create
version: "1"
purpose: Create one support ticket for one workflow step.
effect_class: key_based
operation_key:
  supplied_by: application
  scope: [tenant, environment, workflow_id, step_id]
  reused_for_retry: true
input_schema:
  type: object
  properties:
    subject: {{type: string, minLength: 1}}
  required: [subject]
  additionalProperties: false
request_fingerprint:
  fields: [subject]
  mismatch: rejected
downstream:
  deduplicates_by_key: true
  receipt_lookup: false
  receipt: ticket_id
  http:
    method: POST
    url: http://{sor}/tickets
    idempotency_header: Idempotency-Key
    reference: /ticket_id
    timeouts: {{connect: 2s, total: 5s}}
security:
  recheck_authorization: true
  authorization_hook:
    url: http://{sor}/auth
    timeout: 2s
retention:
  record_ttl: 1d
  tombstone_ttl: 2d
  late_arrival: reject
  max_retry_window: 1d
owner:
  reconciliation: test
  next_review: "2027-02-01"
"#
    )
}

#[test]
fn a_delivery_is_one_trace_under_the_callers_traceparent() {
    let sor = HttpServer::start(system_of_record);
    let otlp = HttpServer::start(collector);
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("contracts")).unwrap();
    std::fs::write(
        dir.path().join("contracts/tickets.create.yaml"),
        contract(&sor.addr),
    )
    .unwrap();
    let config = format!(
        "listen = \"127.0.0.1:0\"\nenvironment = \"traces\"\nstore = \"sqlite://{0}/gate.sqlite\"\n\
         contracts = [\"{0}/contracts/*.yaml\"]\n[[tenants]]\nname = \"t1\"\n\
         [[tenants.tokens]]\nname = \"agent\"\nsha256 = \"{1}\"\nrole = \"agent\"\n",
        dir.path().display(),
        hash_token(TOKEN)
    );
    let endpoint = format!("http://{}", otlp.addr);
    let serve = Serve::start(
        dir.path(),
        &config,
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    );
    let auth = format!("Bearer {TOKEN}");
    let traceparent = format!("00-{TRACE_ID}-{CALLER_SPAN}-01");
    let answer = serve.request(
        "POST",
        "/v1/tools/tickets.create/invoke",
        &[
            ("Authorization", auth.as_str()),
            ("Idempotency-Key", "\"run_9:open\""),
            ("traceparent", traceparent.as_str()),
        ],
        r#"{"arguments": {"subject": "Printer on fire"}}"#,
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // SIGTERM: the exporter flushes what it holds before the process ends.
    let logs = serve.stop();

    let deadline = Instant::now() + Duration::from_secs(10);
    let spans: Vec<Span> = loop {
        let spans: Vec<Span> = otlp
            .received()
            .iter()
            .filter(|r| r.path == "/v1/traces")
            .flat_map(|r| {
                assert_eq!(
                    r.headers.get("content-type").map(String::as_str),
                    Some("application/x-protobuf")
                );
                ExportTraceServiceRequest::decode(r.body.as_slice())
                    .expect("an OTLP protobuf body")
                    .resource_spans
            })
            .flat_map(|rs| rs.scope_spans)
            .flat_map(|ss| ss.spans)
            .collect();
        if spans.iter().any(|s| s.name == "delivery") || Instant::now() > deadline {
            break spans;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let by_name: HashMap<&str, &Span> = spans.iter().map(|s| (s.name.as_str(), s)).collect();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    let get = |name: &str| {
        *by_name
            .get(name)
            .unwrap_or_else(|| panic!("no span {name}; spans {names:?}; log:\n{logs}"))
    };

    for span in &spans {
        assert_eq!(
            hex(&span.trace_id),
            TRACE_ID,
            "{} left the trace",
            span.name
        );
    }
    let request = get("POST /v1/tools/{tool}/invoke");
    assert_eq!(hex(&request.parent_span_id), CALLER_SPAN);
    let delivery = get("delivery");
    assert_eq!(delivery.parent_span_id, request.span_id);
    assert_eq!(
        attribute(delivery, "tool").as_deref(),
        Some("tickets.create")
    );
    assert_eq!(
        attribute(delivery, "operation_key").as_deref(),
        Some("t1:traces:run_9:open")
    );
    assert_eq!(attribute(delivery, "outcome").as_deref(), Some("applied"));
    assert_eq!(attribute(delivery, "attempt").as_deref(), Some("1"));
    assert_eq!(attribute(delivery, "fence").as_deref(), Some("1"));
    for child in ["claim", "authorize", "downstream", "finalise"] {
        assert_eq!(
            get(child).parent_span_id,
            delivery.span_id,
            "{child} is not a child of the delivery"
        );
    }

    // The effect and the hook were each called once, naming the span that called them.
    let calls = sor.received();
    let sent_under = |path: &str| {
        let matching: Vec<&Received> = calls.iter().filter(|r| r.path == path).collect();
        assert_eq!(matching.len(), 1, "{path} called {} times", matching.len());
        matching[0].headers.get("traceparent").cloned()
    };
    assert_eq!(
        sent_under("/tickets"),
        Some(format!(
            "00-{TRACE_ID}-{}-01",
            hex(&get("downstream").span_id)
        ))
    );
    assert_eq!(
        sent_under("/auth"),
        Some(format!(
            "00-{TRACE_ID}-{}-01",
            hex(&get("authorize").span_id)
        ))
    );
}
