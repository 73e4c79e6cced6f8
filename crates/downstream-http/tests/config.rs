//! The `downstream.http` and `security.authorization_hook` sections: the example contracts
//! build, and every mistake is refused at load with the field it concerns.

mod common;

use common::load;
use idemgate_downstream_http::{ConfigError, HttpAuthorizer, HttpDownstream};

/// A key-based contract with `downstream` (indented by two) and `security` sections.
fn contract(downstream: &str, security: &str) -> idemgate_core::contract::Contract {
    load(&format!(
        r#"name: tickets.create
version: "1"
effect_class: key_based
input_schema:
  type: object
  properties:
    subject: {{type: string}}
    ticket_id: {{type: string}}
request_fingerprint:
  fields: [subject]
downstream:
{downstream}
security:
  recheck_authorization: true
{security}
retention:
  record_ttl: 1h
  tombstone_ttl: 1d
  max_retry_window: 1h
"#
    ))
}

/// The field an `http` section (indented under `downstream.http`) is refused for.
fn refused_field(http: &str) -> (String, String) {
    let indented: String = http.lines().map(|l| format!("    {l}\n")).collect();
    let downstream =
        format!("  deduplicates_by_key: true\n  receipt_lookup: false\n  http:\n{indented}");
    match HttpDownstream::from_contract(&contract(&downstream, "")) {
        Err(ConfigError::Invalid { field, message, .. }) => (field, message),
        other => panic!("expected a refusal for\n{http}\ngot {other:?}"),
    }
}

#[test]
#[rustfmt::skip]
fn mistakes_name_their_field() {
    let check = |http: &str, field: &str, needle: &str| {
        let (f, m) = refused_field(http);
        assert_eq!(f, field, "{http}: {m}");
        assert!(m.contains(needle), "{http}: `{m}` lacks `{needle}`");
    };
    let ok = "url: http://127.0.0.1:9000/tickets\nreference: /ticket_id";
    check("url: http://h/t\nreference: /id\nmethd: POST", "downstream.http.methd", "unknown field `methd`");
    check("url: http://h/t", "downstream.http", "missing field `reference`");
    check(&format!("{ok}\nmethod: BREW"), "downstream.http.method", "not one of");
    check("url: http://h/t\nreference: id", "downstream.http.reference", "write `/id`");
    check(&format!("{ok}\nresult: ticket"), "downstream.http.result", "not a JSON pointer");
    check("url: ftp://h/t\nreference: /id", "downstream.http.url", "http:// or https://");
    check("url: http://{subject}.example/t\nreference: /id", "downstream.http.url", "never choose where");
    check("url: http://h/t/{nope}\nreference: /id", "downstream.http.url", "`{nope}`");
    check(&format!("{ok}\nidempotency_header: 'bad header'"), "downstream.http.idempotency_header", "not a header name");
    check(&format!("{ok}\nheaders: {{'X Y': z}}"), "downstream.http.headers.X Y", "not a header name");
    check(&format!("{ok}\nheaders: {{Idempotency-Key: z}}"), "downstream.http.headers.Idempotency-Key", "set by idemgate");
    check(&format!("{ok}\nheaders_from_env: {{Authorization: IDEMGATE_TEST_UNSET_VARIABLE}}"), "downstream.http.headers_from_env.Authorization", "not set");
    check(&format!("{ok}\ntimeouts: {{total: 2h}}"), "downstream.http.timeouts.total", "unit `h`");
    check(&format!("{ok}\ntimeouts: {{connect: 0s}}"), "downstream.http.timeouts.connect", "zero");
    check(&format!("{ok}\ntimeouts: {{total: 1s, idle: 2s}}"), "downstream.http.timeouts.idle", "unknown field `idle`");
    check(&format!("{ok}\nbody: form"), "downstream.http.body", "unknown variant `form`");
    check(&format!("{ok}\nlookup: {{url: 'http://h/k/{{operation_key}}'}}"), "downstream.http.lookup", "does not declare");
    check(&format!("{ok}\njob: {{id: /j, poll_url: 'http://h/j/{{job_id}}', state: /s, reference: /r}}"), "downstream.http.job", "does not declare");
}

#[test]
fn declared_lookups_and_jobs_must_be_configured() {
    let missing = |downstream: &str, field: &str| match HttpDownstream::from_contract(&contract(
        downstream, "",
    )) {
        Err(ConfigError::Invalid { field: f, .. }) => assert_eq!(f, field),
        other => panic!("expected a refusal, got {other:?}"),
    };
    let http = "  http:\n    url: http://h/t\n    reference: /id\n";
    missing(
        &format!("  receipt_lookup: true\n{http}"),
        "downstream.http.lookup",
    );
    missing(
        &format!("  async_jobs: true\n{http}"),
        "downstream.http.job",
    );
    let lookup_with_argument =
        format!("  receipt_lookup: true\n{http}    lookup: {{url: 'http://h/k/{{subject}}'}}\n");
    missing(&lookup_with_argument, "downstream.http.lookup.url");
    let poll_without_id = format!(
        "  async_jobs: true\n{http}    job: {{id: /j, poll_url: 'http://h/jobs', state: /s, reference: /r}}\n"
    );
    missing(&poll_without_id, "downstream.http.job.poll_url");
    let no_http = HttpDownstream::from_contract(&contract("  receipt_lookup: false", ""));
    assert!(matches!(no_http, Err(ConfigError::Missing { .. })));
    let shown = no_http.unwrap_err().to_string();
    assert!(shown.contains("downstream.http"), "{shown}");
}

#[test]
fn the_hook_section_is_optional_and_checked() {
    let plain = contract("  receipt_lookup: false", "");
    assert!(HttpAuthorizer::from_contract(&plain).unwrap().is_none());
    let hook = |section: &str| {
        let indented: String = section.lines().map(|l| format!("    {l}\n")).collect();
        HttpAuthorizer::from_contract(&contract(
            "  receipt_lookup: false",
            &format!("  authorization_hook:\n{indented}"),
        ))
    };
    assert!(hook("url: http://127.0.0.1:9000/auth").unwrap().is_some());
    assert!(
        hook("url: http://127.0.0.1:9000/auth\ntimeout: 250ms\nheaders: {X-A: b}")
            .unwrap()
            .is_some()
    );
    let field = |section: &str| match hook(section) {
        Err(ConfigError::Invalid { field, .. }) => field,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert_eq!(
        field("url: http://h/auth/{tenant}"),
        "security.authorization_hook.url"
    );
    assert_eq!(field("url: mailto:x"), "security.authorization_hook.url");
    assert_eq!(field("timeout: 1s"), "security.authorization_hook");
    assert_eq!(
        field("url: http://h/auth\ntimeout: soon"),
        "security.authorization_hook.timeout"
    );
    assert_eq!(
        field("url: http://h/auth\nretries: 3"),
        "security.authorization_hook.retries"
    );
}

#[test]
fn every_example_contract_builds_its_downstream() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../contracts");
    let mut built = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let contract = idemgate_core::contract::Contract::load(&text, &path.display().to_string())
            .unwrap_or_else(|e| panic!("{e}"));
        let downstream = HttpDownstream::from_contract(&contract)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        HttpAuthorizer::from_contract(&contract)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        built.push(downstream.tool().to_string());
    }
    built.sort();
    assert_eq!(
        built,
        [
            "email.send",
            "reports.generate",
            "tickets.create",
            "tickets.get",
            "tickets.set_status"
        ]
    );
}
