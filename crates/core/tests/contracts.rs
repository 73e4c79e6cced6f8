//! Contract loading as data: the example contracts load, broken files are refused with an error
//! that names the file, the line and the field, and arguments are validated and reduced to
//! their material fields without ever echoing a value.

use std::path::{Path, PathBuf};

use idemgate_core::contract::{ApprovalRule, Contract, LateArrival, LoadError};
use idemgate_core::{EffectClass, json};
use serde_json::Value;

fn contracts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contracts")
}

fn read(name: &str) -> String {
    let path = contracts_dir().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn load(name: &str) -> Contract {
    Contract::load(&read(name), name).unwrap_or_else(|e| panic!("{e}"))
}

/// `text` with `from` replaced by `to`; `from` must occur exactly once, so that an edit of an
/// example contract cannot silently stop applying.
fn edit(text: &str, from: &str, to: &str) -> String {
    assert_eq!(text.matches(from).count(), 1, "`{from}` must occur once");
    text.replacen(from, to, 1)
}

/// The 1-based line of the first line of `text` that contains `marker`.
fn line_with(text: &str, marker: &str) -> usize {
    text.lines()
        .position(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("no line contains `{marker}`"))
        + 1
}

// ---------------------------------------------------------------------------------------------
// The examples.

fn check_example(
    file: &str,
    class: EffectClass,
    requires_key: bool,
    dedup_lookup_jobs_marker: [bool; 4],
    approval: ApprovalRule,
    late: LateArrival,
    lease_seconds: u64,
) {
    let c = load(file);
    assert_eq!(
        format!("{}.yaml", c.name),
        file,
        "a contract file is named after its tool"
    );
    assert_eq!(c.effect_class, class, "{file}");
    assert_eq!(c.requires_key(), requires_key, "{file}");
    assert_eq!(
        [
            c.deduplicates(),
            c.receipt_lookup(),
            c.async_jobs(),
            c.uses_dispatch_marker()
        ],
        dedup_lookup_jobs_marker,
        "{file}: [deduplicates, receipt_lookup, async_jobs, dispatch marker]"
    );
    assert_eq!(c.approval(), approval, "{file}");
    assert_eq!(c.late_arrival(), late, "{file}");
    assert_eq!(c.lease.seconds(), lease_seconds, "{file}");
    assert!(c.recheck_authorization(), "{file}");
}

#[test]
fn every_example_contract_loads() {
    use ApprovalRule::{Always, Never, WhenMatches};
    use EffectClass::*;
    use LateArrival::{Reject, Tombstone};
    check_example(
        "tickets.create.yaml",
        KeyBased,
        true,
        [true, true, false, false],
        WhenMatches,
        Reject,
        30,
    );
    check_example(
        "email.send.yaml",
        Irreversible,
        true,
        [false, true, false, true],
        Always,
        Tombstone,
        30,
    );
    check_example(
        "tickets.set_status.yaml",
        NaturalIdempotent,
        false,
        [false, false, false, true],
        Never,
        Reject,
        30,
    );
    check_example(
        "tickets.get.yaml",
        Read,
        false,
        [false, false, false, true],
        Never,
        Reject,
        30,
    );
    check_example(
        "reports.generate.yaml",
        KeyBased,
        true,
        [true, false, true, false],
        Never,
        Tombstone,
        60,
    );
}

#[test]
fn no_example_is_left_untested() {
    let mut files: Vec<String> = std::fs::read_dir(contracts_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "email.send.yaml",
            "reports.generate.yaml",
            "tickets.create.yaml",
            "tickets.get.yaml",
            "tickets.set_status.yaml"
        ]
    );
}

#[test]
fn retention_and_versions_are_read() {
    let c = load("tickets.create.yaml");
    assert_eq!(c.version, "2026-08-18");
    assert_eq!(
        [
            c.retention.record_ttl.seconds(),
            c.retention.tombstone_ttl.seconds(),
            c.retention.max_retry_window.seconds()
        ],
        [7 * 86_400, 30 * 86_400, 86_400]
    );
    assert_eq!(
        c.file.owner.reconciliation.as_deref(),
        Some("support-platform-oncall")
    );
    // A read tool without a written retention gets the built-in one rather than a refusal.
    let get = load("tickets.get.yaml");
    assert!(get.file.retention.is_none());
    assert!(get.retention.record_ttl.seconds() >= get.retention.max_retry_window.seconds());
}

// ---------------------------------------------------------------------------------------------
// Refusals. Each case edits an example, then names the marker of the line the error must point
// at (None: no line), the field, and a fragment of the message.

fn check_refusal(
    base: &str,
    (from, to): (&str, &str),
    line: Option<&str>,
    field: Option<&str>,
    message: &str,
) {
    let text = edit(&read(base), from, to);
    let err: LoadError = match Contract::load(&text, "c.yaml") {
        Ok(c) => panic!("{from} -> {to}: loaded {c:?}"),
        Err(e) => e,
    };
    let shown = err.to_string();
    assert_eq!(err.file, "c.yaml", "{shown}");
    assert_eq!(err.line, line.map(|m| line_with(&text, m)), "{shown}");
    assert_eq!(err.field.as_deref(), field, "{shown}");
    assert!(
        err.message.contains(message),
        "`{shown}` does not contain `{message}`"
    );
    // The one-line form carries all of it.
    assert!(shown.starts_with("c.yaml"), "{shown}");
    if let Some(l) = err.line {
        assert!(shown.starts_with(&format!("c.yaml:{l}")), "{shown}");
    }
    if let Some(f) = field {
        assert!(shown.contains(&format!("field `{f}`")), "{shown}");
    }
}

#[test]
fn syntax_and_shape_errors_name_file_line_and_field() {
    let t = "tickets.create.yaml";
    // Malformed YAML: there is no field to name, but there is a line.
    check_refusal(
        t,
        ("purpose: Create one", "purpose: Create: one"),
        Some("purpose:"),
        None,
        "mapping values are not allowed",
    );
    check_refusal(
        t,
        ("  scope: [tenant,", "  scope: [tenant,,"),
        Some("  scope:"),
        None,
        "",
    );
    check_refusal(
        t,
        ("    trace_id:\n", "\ttrace_id:\n"),
        Some("\ttrace_id"),
        None,
        "tab",
    );
    // Unknown fields, at the top and nested.
    check_refusal(
        t,
        ("purpose:", "colour: blue\npurpose:"),
        Some("colour:"),
        Some("colour"),
        "unknown field `colour`, expected one of `name`",
    );
    check_refusal(
        t,
        (
            "  receipt_lookup: true",
            "  receipt_lookup: true\n  dedupe: true",
        ),
        Some("dedupe:"),
        Some("downstream"),
        "unknown field `dedupe`",
    );
    check_refusal(
        t,
        (
            "  late_arrival: reject",
            "  late_arrival: reject\n  ttl: 3d",
        ),
        Some("  ttl:"),
        Some("retention"),
        "unknown field `ttl`",
    );
    check_refusal(
        t,
        (
            "  reused_for_retry: true",
            "  reused_for_retry: true\n  derived_by: app",
        ),
        Some("derived_by"),
        Some("operation_key"),
        "unknown field `derived_by`",
    );
    check_refusal(
        t,
        (
            "  mismatch: rejected",
            "  mismatch: rejected\n  algorithm: SHA-256",
        ),
        Some("algorithm"),
        Some("request_fingerprint"),
        "unknown field `algorithm`",
    );
    // Wrong types.
    check_refusal(
        t,
        ("deduplicates_by_key: true", "deduplicates_by_key: often"),
        Some("often"),
        Some("downstream.deduplicates_by_key"),
        "expected a boolean",
    );
    check_refusal(
        t,
        (
            "effect_class: key_based",
            "effect_class: key_based_idempotent",
        ),
        Some("effect_class:"),
        Some("effect_class"),
        "unknown variant `key_based_idempotent`",
    );
    check_refusal(
        t,
        ("late_arrival: reject", "late_arrival: forget"),
        Some("late_arrival:"),
        Some("retention.late_arrival"),
        "unknown variant `forget`",
    );
    check_refusal(
        t,
        ("  subject: [trim]", "  subject: [strip]"),
        Some("[strip]"),
        Some("request_fingerprint.normalize.subject[0]"),
        "unknown variant `strip`",
    );
    check_refusal(
        t,
        ("\nuse_when:\n  - The workflow", "\nuse_when: The workflow"),
        Some("use_when:"),
        Some("use_when"),
        "invalid type: string",
    );
    check_refusal(
        t,
        ("reused_for_retry: true", "reused_for_retry: maybe"),
        Some("maybe"),
        Some("operation_key.reused_for_retry"),
        "expected a boolean",
    );
    check_refusal(
        "reports.generate.yaml",
        ("lease_seconds: 60", "lease_seconds: soon"),
        Some("lease_seconds:"),
        Some("lease_seconds"),
        "invalid type",
    );
    // Missing required fields.
    check_refusal(
        t,
        ("name: tickets.create\n", ""),
        Some("version:"),
        Some("name"),
        "missing field `name`",
    );
    check_refusal(
        t,
        ("effect_class: key_based\n", ""),
        Some("name:"),
        Some("effect_class"),
        "missing field `effect_class`",
    );
    check_refusal(
        t,
        ("  max_retry_window: 1d\n", ""),
        Some("record_ttl"),
        Some("retention"),
        "missing field `max_retry_window`",
    );
}

#[test]
fn a_bad_duration_names_its_own_field() {
    // A duration that does not parse must point at the duration, not only at its section:
    // `retention` has three durations and the message alone does not say which one is wrong.
    let t = "tickets.create.yaml";
    check_refusal(
        t,
        ("  tombstone_ttl: 30d", "  tombstone_ttl: 30w"),
        Some("30w"),
        Some("retention.tombstone_ttl"),
        "`30w` has unit `w`",
    );
    check_refusal(
        t,
        ("  record_ttl: 7d", "  record_ttl: soon"),
        Some("soon"),
        Some("retention.record_ttl"),
        "`soon` is not a duration",
    );
}

const NON_IDEMPOTENT: &str = "`non_idempotent` tools are refused: a repeated delivery would repeat the effect. \
    Redesign it as a keyed command (effect_class: key_based, with the operation key sent to a downstream that \
    deduplicates on it or offers a receipt lookup) or as an absolute update (effect_class: natural_idempotent";

#[test]
fn semantic_refusals_name_the_field() {
    let t = "tickets.create.yaml";
    let get = "tickets.get.yaml";
    let set = "tickets.set_status.yaml";
    check_refusal(
        t,
        ("effect_class: key_based", "effect_class: non_idempotent"),
        Some("effect_class:"),
        Some("effect_class"),
        NON_IDEMPOTENT,
    );
    check_refusal(
        t,
        ("version: \"2026-08-18\"\n", ""),
        None,
        Some("version"),
        "a contract needs a version: it is part of every fingerprint",
    );
    check_refusal(
        t,
        ("version: \"2026-08-18\"", "version: \"  \""),
        Some("version:"),
        Some("version"),
        "a contract needs a version",
    );
    check_refusal(
        t,
        (
            "fields: [queue_id, subject, body]",
            "fields: [queue_id, subject, body, priority]",
        ),
        Some("  fields:"),
        Some("request_fingerprint.fields"),
        "material field `priority` is not a property of input_schema",
    );
    check_refusal(
        t,
        ("fields: [queue_id, subject, body]", "fields: []"),
        Some("  fields:"),
        Some("request_fingerprint.fields"),
        "name the material fields",
    );
    check_refusal(
        t,
        (
            "fields: [queue_id, subject, body]",
            "fields: [\"*\", subject]",
        ),
        Some("  fields:"),
        Some("request_fingerprint.fields"),
        "`*` stands alone",
    );
    check_refusal(
        t,
        (
            "    queue_id: support",
            "    queue_id: support\n    trace_id: none",
        ),
        Some("  defaults:"),
        Some("request_fingerprint.defaults"),
        "default for `trace_id`, which is not a material field",
    );
    check_refusal(
        t,
        ("    queue_id: support", "    queue_id: 9007199254740993"),
        Some("  defaults:"),
        Some("request_fingerprint.defaults"),
        "`queue_id`: a number is an integer beyond ±2^53",
    );
    check_refusal(
        t,
        ("    subject: [trim]", "    trace_id: [trim]"),
        Some("  normalize:"),
        Some("request_fingerprint.normalize"),
        "normalisation for `trace_id`, which is not a material field",
    );
    check_refusal(
        t,
        (
            "  record_ttl: 7d\n  tombstone_ttl: 30d",
            "  record_ttl: 1h\n  tombstone_ttl: 2h",
        ),
        Some("max_retry_window"),
        Some("retention.max_retry_window"),
        "records and tombstones are kept 1h + 2h in all, shorter than the retry window 1d",
    );
    check_refusal(
        t,
        ("  record_ttl: 7d", "  record_ttl: 0"),
        Some("record_ttl"),
        Some("retention.record_ttl"),
        "must be longer than zero",
    );
    check_refusal(
        t,
        (
            "retention:\n  record_ttl: 7d\n  tombstone_ttl: 30d\n  late_arrival: reject\n  max_retry_window: 1d\n",
            "",
        ),
        None,
        Some("retention"),
        "key-based and irreversible tools need a retention rule",
    );
    check_refusal(
        t,
        ("input_schema:", "unused_schema:"),
        Some("unused_schema"),
        Some("unused_schema"),
        "unknown field",
    );
    check_refusal(
        t,
        ("  type: object\n  properties:", "  type: 12\n  properties:"),
        Some("input_schema:"),
        Some("input_schema"),
        "not a valid JSON Schema",
    );
    check_refusal(
        t,
        ("  approval_when:\n    queue_id: [legal]\n", ""),
        None,
        Some("security.approval_when"),
        "`approval: when_matches` needs at least one field",
    );
    check_refusal(
        t,
        (
            "  receipt: ticket_id",
            "  receipt: ticket_id\n  version_precondition: queue_id",
        ),
        Some("version_precondition"),
        Some("downstream.version_precondition"),
        "belongs to natural_idempotent tools",
    );
    check_refusal(
        get,
        (
            "effect_class: read\n",
            "effect_class: read\nsecurity:\n  approval: always\n",
        ),
        Some("approval:"),
        Some("security.approval"),
        "only key-based and irreversible tools have one",
    );
    check_refusal(
        set,
        ("retention:", "security:\n  approval: always\nretention:"),
        Some("approval:"),
        Some("security.approval"),
        "only key-based and irreversible tools have one",
    );
    check_refusal(
        set,
        (
            "version_precondition: expected_version",
            "version_precondition: etag",
        ),
        Some("version_precondition"),
        Some("downstream.version_precondition"),
        "`etag` is not a property of input_schema",
    );
    check_refusal(
        t,
        ("name: tickets.create", "name: tickets create"),
        Some("name:"),
        Some("name"),
        "a tool name is 1 to 128 characters",
    );
    check_refusal(
        t,
        ("name: tickets.create", "name: tickets/create"),
        Some("name:"),
        Some("name"),
        "a tool name is 1 to 128 characters",
    );
    check_refusal(
        t,
        ("name: tickets.create", "name: \"\""),
        Some("name:"),
        Some("name"),
        "a tool name is 1 to 128 characters",
    );
    check_refusal(
        t,
        (
            "name: tickets.create",
            &format!("name: {}", "t".repeat(129)),
        ),
        Some("name:"),
        Some("name"),
        "a tool name is 1 to 128 characters",
    );
    check_refusal(
        "reports.generate.yaml",
        ("lease_seconds: 60", "lease_seconds: 2"),
        Some("lease_seconds"),
        Some("lease_seconds"),
        "a lease under 3 seconds cannot be renewed reliably",
    );
}

#[test]
fn edge_values_that_are_accepted() {
    let t = read("tickets.create.yaml");
    for (from, to) in [
        ("name: tickets.create", format!("name: {}", "t".repeat(128))),
        ("name: tickets.create", "name: Tickets_Create-2".to_string()),
        (
            "  record_ttl: 7d\n  tombstone_ttl: 30d",
            "  record_ttl: 12h\n  tombstone_ttl: 12h".to_string(),
        ),
        ("owner:", "lease_seconds: 3\nowner:".to_string()),
    ] {
        let text = edit(&t, from, &to);
        if let Err(e) = Contract::load(&text, "c.yaml") {
            panic!("{to}: {e}");
        }
    }
}

#[test]
fn bad_examples_that_the_loader_refuses() {
    let check = |file: &str, field: &str, message: &str| {
        let text = read(file);
        let err = Contract::load(&text, file).unwrap_err();
        assert_eq!(err.field.as_deref(), Some(field), "{err}");
        assert!(err.message.contains(message), "{err}");
        assert!(err.to_string().starts_with(&format!("{file}:")), "{err}");
    };
    check("bad/ledger.append.yaml", "effect_class", NON_IDEMPOTENT);
    check(
        "bad/refunds.issue.yaml",
        "retention.max_retry_window",
        "shorter than the retry window 1d",
    );
}

#[test]
fn bad_examples_that_load_but_the_linter_flags() {
    // These are unsafe designs the loader cannot judge (scope, receipt path, transport fields,
    // approval on an irreversible tool); the linter is what stops them.
    for file in [
        "bad/messages.post.yaml",
        "bad/payments.charge.yaml",
        "bad/webhooks.notify.yaml",
        "bad/accounts.delete.yaml",
    ] {
        if let Err(e) = Contract::load(&read(file), file) {
            panic!("{e}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Arguments.

/// A value that must never appear in an error message.
const SECRET: &str = "sk_live_9f8e7d6c5b4a";

fn check_args(file: &str, arguments: &str, expect: Result<(), &str>) {
    let c = load(file);
    let args = json::parse(arguments.as_bytes()).unwrap();
    match (c.validate(&args), expect) {
        (Ok(()), Ok(())) => {}
        (Err(e), Err(message)) => {
            assert_eq!(e.message, message, "{arguments}");
            assert!(
                !e.message.contains(SECRET),
                "the message echoes a value: {e}"
            );
        }
        (got, expect) => panic!("{arguments}: got {got:?}, expected {expect:?}"),
    }
}

#[test]
fn arguments_are_validated_without_echoing_values() {
    let t = "tickets.create.yaml";
    let head = "arguments do not match the input schema of tickets.create 2026-08-18: ";
    let msg = |m: &str| format!("{head}{m}");
    check_args(t, r#"{"subject":"Refund","body":"x"}"#, Ok(()));
    check_args(
        t,
        r#"{"subject":"Refund","body":"x","queue_id":"legal","trace_id":"abc"}"#,
        Ok(()),
    );
    check_args(
        t,
        &format!(r#"{{"subject":"Refund","body":"x","api_key":"{SECRET}"}}"#),
        Err(&msg("at `/`: unexpected properties api_key")),
    );
    check_args(
        t,
        &format!(r#"{{"body":"{SECRET}"}}"#),
        Err(&msg("at `/`: required property \"subject\" is missing")),
    );
    check_args(
        t,
        r#"{"subject":"","body":"x"}"#,
        Err(&msg("at `/subject`: shorter than 1 characters")),
    );
    check_args(
        t,
        &format!(
            r#"{{"subject":"Refund","body":"x","queue_id":"{}{SECRET}"}}"#,
            "q".repeat(64)
        ),
        Err(&msg("at `/queue_id`: longer than 64 characters")),
    );
    check_args(
        t,
        r#"{"subject":42,"body":"x"}"#,
        Err(&msg("at `/subject`: wrong type, expected string")),
    );
    check_args(
        t,
        &format!(r#"[{{"subject":"{SECRET}"}}]"#),
        Err(&msg("at `/`: wrong type, expected object")),
    );
    let s = "tickets.set_status.yaml";
    let head = "arguments do not match the input schema of tickets.set_status 2026-08-18: ";
    let msg = |m: &str| format!("{head}{m}");
    check_args(
        s,
        r#"{"ticket_id":"ticket_1042","status":"closed","expected_version":3}"#,
        Ok(()),
    );
    check_args(
        s,
        &format!(r#"{{"ticket_id":"{SECRET}","status":"closed","expected_version":3}}"#),
        Err(&msg(
            "at `/ticket_id`: does not match pattern ^ticket_[0-9]+$",
        )),
    );
    check_args(
        s,
        &format!(r#"{{"ticket_id":"ticket_1","status":"{SECRET}","expected_version":3}}"#),
        Err(&msg("at `/status`: not one of the allowed values")),
    );
    check_args(
        s,
        r#"{"ticket_id":"ticket_1","status":"closed","expected_version":-1}"#,
        Err(&msg("at `/expected_version`: below the minimum")),
    );
    check_args(
        s,
        &format!(r#"{{"ticket_id":"{SECRET}","status":"{SECRET}","expected_version":"{SECRET}"}}"#),
        Err(&msg(
            "at `/expected_version`: wrong type, expected integer; at `/status`: not one of the allowed values; at `/ticket_id`: does not match pattern ^ticket_[0-9]+$",
        )),
    );
}

fn check_material(file: &str, arguments: &str, expect: &str) {
    let c = load(file);
    let args = json::parse(arguments.as_bytes()).unwrap();
    let got = Value::Object(c.material(&args).unwrap().fields().clone());
    assert_eq!(
        got,
        serde_json::from_str::<Value>(expect).unwrap(),
        "{arguments}"
    );
}

#[test]
fn material_fields_are_selected_defaulted_and_normalised() {
    let t = "tickets.create.yaml";
    // The default fills an omitted field; a non-material field is dropped; the subject is
    // trimmed and the body kept byte for byte.
    check_material(
        t,
        r#"{"subject":"Refund","body":"x"}"#,
        r#"{"queue_id":"support","subject":"Refund","body":"x"}"#,
    );
    check_material(
        t,
        r#"{"subject":" Refund\n","body":" x \n","trace_id":"t-1"}"#,
        r#"{"queue_id":"support","subject":"Refund","body":" x \n"}"#,
    );
    check_material(
        t,
        r#"{"queue_id":"legal","subject":"\tRe fund ","body":""}"#,
        r#"{"queue_id":"legal","subject":"Re fund","body":""}"#,
    );
    check_material(
        t,
        r#"{"queue_id":"support","subject":"Refund","body":"x"}"#,
        r#"{"queue_id":"support","subject":"Refund","body":"x"}"#,
    );
    // Trimming is Unicode-aware (U+3000 ideographic space), and never touches the inside.
    check_material(
        t,
        "{\"subject\":\"\u{3000}Refund  request\u{3000}\",\"body\":\"x\"}",
        r#"{"queue_id":"support","subject":"Refund  request","body":"x"}"#,
    );
    let e = "email.send.yaml";
    check_material(
        e,
        r#"{"to":" Ana@Example.COM ","subject":"Hi","body":"B"}"#,
        r#"{"to":"ana@example.com","subject":"Hi","body":"B"}"#,
    );
    check_material(
        e,
        r#"{"to":"a@b.c","subject":"Hi","body":"B","reply_to":"X@Y.Z"}"#,
        r#"{"to":"a@b.c","subject":"Hi","body":"B","reply_to":"X@Y.Z"}"#,
    );
    let r = "reports.generate.yaml";
    check_material(
        r,
        r#"{"report_type":"usage","period_start":"2026-10-01","period_end":"2026-10-31"}"#,
        r#"{"report_type":"usage","period_start":"2026-10-01","period_end":"2026-10-31","format":"pdf"}"#,
    );
    check_material(
        r,
        r#"{"report_type":"usage","period_start":"2026-10-01","period_end":"2026-10-31","format":"csv"}"#,
        r#"{"report_type":"usage","period_start":"2026-10-01","period_end":"2026-10-31","format":"csv"}"#,
    );
    check_material("tickets.get.yaml", r#"{"ticket_id":"ticket_1"}"#, "{}");
    // A wildcard fingerprint takes every argument, transport fields included (the linter's
    // `fingerprint-over-everything` finding is about exactly this).
    check_material(
        "bad/messages.post.yaml",
        r#"{"conversation_id":"c1","text":"hi","trace_id":"t-9"}"#,
        r#"{"conversation_id":"c1","text":"hi","trace_id":"t-9"}"#,
    );
}

#[test]
fn material_refusals_name_the_field_not_the_value() {
    let c = load("tickets.create.yaml");
    let check = |arguments: &str, message: &str| {
        let args = json::parse(arguments.as_bytes()).unwrap();
        let err = c.material(&args).unwrap_err();
        assert_eq!(err.message, message);
        assert!(!err.message.contains(SECRET));
    };
    check(
        &format!(r#"["{SECRET}"]"#),
        "arguments must be a JSON object",
    );
    check(
        r#"{"subject":7,"body":"x"}"#,
        "material field `subject` is normalised as text but is not a string",
    );
    // A value built in-process (not parsed) can still carry an integer JSON cannot keep
    // distinct; canonicalisation names the field.
    let args = serde_json::json!({"subject": SECRET, "body": 9_007_199_254_740_993u64});
    let err = c.canonicalize(&args).unwrap_err();
    assert_eq!(
        err.message,
        "material field `body`: a number is an integer beyond ±2^53, which JSON canonicalisation cannot keep distinct; send it as a string"
    );
}

#[test]
fn approval_and_preconditions() {
    let check = |file: &str, arguments: &str, approval: bool| {
        let c = load(file);
        let args = json::parse(arguments.as_bytes()).unwrap();
        assert_eq!(c.needs_approval(&args), approval, "{file} {arguments}");
    };
    check(
        "tickets.create.yaml",
        r#"{"queue_id":"legal","subject":"s","body":"b"}"#,
        true,
    );
    check(
        "tickets.create.yaml",
        r#"{"queue_id":"support","subject":"s","body":"b"}"#,
        false,
    );
    check(
        "tickets.create.yaml",
        r#"{"subject":"s","body":"b"}"#,
        false,
    );
    check(
        "email.send.yaml",
        r#"{"to":"a@b.c","subject":"s","body":"b"}"#,
        true,
    );
    check(
        "reports.generate.yaml",
        r#"{"report_type":"usage","period_start":"a","period_end":"b"}"#,
        false,
    );
    check(
        "tickets.set_status.yaml",
        r#"{"ticket_id":"ticket_1","status":"closed","expected_version":4}"#,
        false,
    );
    check("tickets.get.yaml", r#"{"ticket_id":"ticket_1"}"#, false);

    let set = load("tickets.set_status.yaml");
    let args =
        json::parse(br#"{"ticket_id":"ticket_1","status":"closed","expected_version":4}"#).unwrap();
    assert_eq!(set.precondition(&args), Some(&Value::from(4)));
    let create = load("tickets.create.yaml");
    assert_eq!(create.precondition(&args), None);
}

#[test]
fn approval_when_judges_the_material_value() {
    // Approval must look at the value the effect will use: the declared default when the field
    // is omitted, and the normalised value when a normalisation applies. Otherwise an agent
    // skips approval by omitting the field, or by writing `LEGAL` for `legal`.
    let text = edit(
        &edit(
            &read("tickets.create.yaml"),
            "    queue_id: [legal]",
            "    queue_id: [support]",
        ),
        "    subject: [trim]",
        "    subject: [trim]\n    queue_id: [trim, lowercase]",
    );
    let c = Contract::load(&text, "c.yaml").unwrap();
    for (arguments, approval) in [
        (r#"{"queue_id":"support","subject":"s","body":"b"}"#, true),
        (r#"{"queue_id":"legal","subject":"s","body":"b"}"#, false),
        (r#"{"subject":"s","body":"b"}"#, true),
        (r#"{"queue_id":" Support ","subject":"s","body":"b"}"#, true),
    ] {
        let args = json::parse(arguments.as_bytes()).unwrap();
        assert_eq!(c.needs_approval(&args), approval, "{arguments}");
    }
}

// ---------------------------------------------------------------------------------------------
// The MCP identity rule.

#[test]
fn identity_is_read_from_the_contract_and_written_back_the_same() {
    use idemgate_core::contract::Identity;
    use idemgate_core::duration::Span;
    let t = "tickets.create.yaml";
    assert_eq!(load(t).identity(), None, "unset: the server's rule applies");
    for (written, expect) in [
        ("meta", Identity::Meta),
        ("session_window", Identity::SessionWindow(Span(600))),
        ("session_window:90s", Identity::SessionWindow(Span(90))),
        ("session_window:2h", Identity::SessionWindow(Span(7200))),
    ] {
        let text = edit(
            &read(t),
            "\nowner:",
            &format!("\nidentity: {written}\nowner:"),
        );
        let c = Contract::load(&text, t).unwrap_or_else(|e| panic!("{written}: {e}"));
        assert_eq!(c.identity(), Some(expect), "{written}");
        assert_eq!(Identity::parse(&expect.to_string()), Ok(expect));
    }
    check_refusal(
        t,
        ("\nowner:", "\nidentity: session_window:soon\nowner:"),
        Some("identity:"),
        Some("identity"),
        "`soon` is not a duration",
    );
    check_refusal(
        t,
        ("\nowner:", "\nidentity: per_call\nowner:"),
        Some("identity:"),
        Some("identity"),
        "not one of `meta`, `session_window`",
    );
    for bad in ["session_window:0s", "meta:10m", ""] {
        assert!(Identity::parse(bad).is_err(), "{bad}");
    }
}

/// `downstream.http.job.max_running` is the job deadline; unset, the retry window; zero or a
/// word is refused, naming the field.
#[test]
fn the_job_deadline_is_read_from_downstream_http_job_max_running() {
    let contract = |max_running: &str| {
        let text = format!(
            "name: exports.generate\nversion: \"1\"\neffect_class: key_based\n\
             input_schema: {{type: object, properties: {{p: {{type: string}}}}}}\n\
             request_fingerprint: {{fields: [p]}}\n\
             downstream:\n  deduplicates_by_key: true\n  async_jobs: true\n  http:\n    job:\n{max_running}\
             retention: {{record_ttl: 3d, tombstone_ttl: 30d, max_retry_window: 1h}}\n"
        );
        idemgate_core::contract::Contract::load(&text, "exports.yaml")
    };
    let c = contract("      max_running: 3d\n").unwrap();
    assert_eq!(c.max_running().seconds(), 3 * 86_400);
    let c = contract("      id: /job_id\n").unwrap();
    assert_eq!(c.max_running().seconds(), 3_600, "the retry window");
    for bad in ["      max_running: 0s\n", "      max_running: soon\n"] {
        let e = contract(bad).err().unwrap().to_string();
        assert!(e.contains("max_running"), "{e}");
    }
}
