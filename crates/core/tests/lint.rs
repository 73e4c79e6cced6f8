//! The linter as data: each bad contract yields exactly its findings, the examples yield no
//! error, and single edits of a good contract raise exactly the rule they concern.

use std::path::Path;

use idemgate_core::contract::ContractFile;
use idemgate_core::lint::{Level, lint};

fn read(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../contracts")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Findings as `level rule field`, in the linter's order (errors first).
fn findings(text: &str, file: &str) -> Vec<String> {
    let cf = ContractFile::parse(text, file).unwrap_or_else(|e| panic!("{e}"));
    lint(&cf)
        .iter()
        .map(|f| {
            assert!(!f.reason.is_empty(), "{f:?}");
            let level = match f.level {
                Level::Error => "error",
                Level::Warning => "warning",
            };
            format!("{level} {} {}", f.rule, f.field)
        })
        .collect()
}

fn check(file: &str, expect: &[&str]) {
    assert_eq!(findings(&read(file), file), expect, "{file}");
}

#[test]
fn bad_contracts_raise_exactly_their_findings() {
    check(
        "bad/ledger.append.yaml",
        &[
            "error non-idempotent-exposed effect_class",
            "error no-receipt-path downstream",
        ],
    );
    check(
        "bad/messages.post.yaml",
        &["error fingerprint-over-everything request_fingerprint.fields"],
    );
    check(
        "bad/payments.charge.yaml",
        &[
            "error transport-field-in-fingerprint request_fingerprint.fields",
            "error transport-field-in-fingerprint request_fingerprint.fields",
        ],
    );
    check(
        "bad/webhooks.notify.yaml",
        &[
            "error key-without-tenant operation_key.scope",
            "error no-receipt-path downstream",
        ],
    );
    check(
        "bad/refunds.issue.yaml",
        &["error retention-shorter-than-retry-window retention"],
    );
    check(
        "bad/accounts.delete.yaml",
        &[
            "error key-not-from-application operation_key.supplied_by",
            "error no-reconciliation-owner owner.reconciliation",
            "error irreversible-without-approval security.approval",
            "warning no-next-review owner.next_review",
        ],
    );
}

#[test]
fn every_bad_contract_is_covered() {
    let mut files: Vec<String> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contracts/bad"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "accounts.delete.yaml",
            "ledger.append.yaml",
            "messages.post.yaml",
            "payments.charge.yaml",
            "refunds.issue.yaml",
            "webhooks.notify.yaml"
        ]
    );
}

#[test]
fn good_examples_raise_no_error() {
    for file in [
        "tickets.create.yaml",
        "email.send.yaml",
        "tickets.set_status.yaml",
        "tickets.get.yaml",
        "reports.generate.yaml",
    ] {
        let errors: Vec<String> = findings(&read(file), file)
            .into_iter()
            .filter(|f| f.starts_with("error"))
            .collect();
        assert!(errors.is_empty(), "{file}: {errors:?}");
    }
}

#[test]
fn reasons_name_what_is_wrong() {
    let cf = ContractFile::parse(&read("bad/payments.charge.yaml"), "p").unwrap();
    let reasons: Vec<String> = lint(&cf).into_iter().map(|f| f.reason).collect();
    assert!(
        reasons[0].starts_with("`trace_id` describes the delivery"),
        "{reasons:?}"
    );
    assert!(
        reasons[1].starts_with("`received_at` describes the delivery"),
        "{reasons:?}"
    );
    let cf = ContractFile::parse(&read("bad/refunds.issue.yaml"), "r").unwrap();
    assert_eq!(
        lint(&cf)[0].reason,
        "record 1h + tombstone 1h is shorter than the retry window 1d: a late retry becomes a new effect"
    );
}

/// One edit of a good contract, and the findings it must produce (the good contracts have none).
fn check_edit(file: &str, (from, to): (&str, &str), expect: &[&str]) {
    let text = read(file);
    assert_eq!(
        text.matches(from).count(),
        1,
        "`{from}` must occur once in {file}"
    );
    assert_eq!(
        findings(&text.replacen(from, to, 1), file),
        expect,
        "{file}: {from} -> {to}"
    );
}

#[test]
fn single_edits_raise_single_rules() {
    let t = "tickets.create.yaml";
    let set = "tickets.set_status.yaml";
    for file in [
        "tickets.create.yaml",
        "email.send.yaml",
        "tickets.set_status.yaml",
        "tickets.get.yaml",
        "reports.generate.yaml",
    ] {
        check(file, &[]);
    }
    check_edit(
        t,
        ("version: \"2026-08-18\"\n", ""),
        &["error no-version version"],
    );
    check_edit(
        t,
        (
            "purpose: Create one support ticket for one validated workflow step.\n",
            "",
        ),
        &["warning no-purpose purpose"],
    );
    check_edit(
        t,
        (
            "do_not_use_when:\n  - The agent only wants to know whether a ticket exists; use tickets.get.\n  - The user asks for a second ticket about the same issue; that is a new step with a new key.\n",
            "",
        ),
        &["warning no-do-not-use-when do_not_use_when"],
    );
    check_edit(
        t,
        (
            "scope: [tenant, environment, workflow_id, step_id]",
            "scope: [tenant, environment]",
        ),
        &["warning key-without-step operation_key.scope"],
    );
    check_edit(
        t,
        ("supplied_by: application", "supplied_by: tool_call_id"),
        &["error key-not-from-application operation_key.supplied_by"],
    );
    check_edit(
        t,
        ("  deduplicates_by_key: true\n  receipt_lookup: true\n", ""),
        &["error no-receipt-path downstream"],
    );
    check_edit(t, ("  receipt_lookup: true\n", ""), &[]);
    check_edit(
        t,
        ("  reconciliation: support-platform-oncall\n", ""),
        &["error no-reconciliation-owner owner.reconciliation"],
    );
    check_edit(
        t,
        ("fields: [queue_id, subject, body]", "fields: []"),
        &["error no-material-fields request_fingerprint.fields"],
    );
    check_edit(
        t,
        (
            "fields: [queue_id, subject, body]",
            "fields: [queue_id, subject, body, attempt, operation_key, sent_at, parent_trace_id]",
        ),
        &[
            "error transport-field-in-fingerprint request_fingerprint.fields",
            "error transport-field-in-fingerprint request_fingerprint.fields",
            "error transport-field-in-fingerprint request_fingerprint.fields",
            "error transport-field-in-fingerprint request_fingerprint.fields",
        ],
    );
    check_edit(
        t,
        (
            "recheck_authorization: true",
            "recheck_authorization: false",
        ),
        &["warning no-authorization-recheck security.recheck_authorization"],
    );
    check_edit(
        t,
        (
            "retention:\n  record_ttl: 7d\n  tombstone_ttl: 30d\n  late_arrival: reject\n  max_retry_window: 1d\n",
            "",
        ),
        &["error no-retention retention"],
    );
    check_edit(
        t,
        ("record_ttl: 7d", "record_ttl: 12h"),
        &["warning record-shorter-than-retry-window retention.record_ttl"],
    );
    // A job deadline the full record does not outlive: its caller finds the result compacted.
    check_edit(
        "reports.generate.yaml",
        (
            "      error_message: /error\n",
            "      error_message: /error\n      max_running: 7d\n",
        ),
        &["error record-shorter-than-job retention.record_ttl"],
    );
    // One it does outlive is no finding (3d of record for a job of up to 2d).
    check_edit(
        "reports.generate.yaml",
        (
            "      error_message: /error\n",
            "      error_message: /error\n      max_running: 2d\n",
        ),
        &[],
    );
    check_edit(
        t,
        ("  next_review: \"2027-02-01\"\n", ""),
        &["warning no-next-review owner.next_review"],
    );
    check_edit(
        "email.send.yaml",
        (
            "  recheck_authorization: true\n",
            "  recheck_authorization: true\n  approval: never\n",
        ),
        &["error irreversible-without-approval security.approval"],
    );
    check_edit(
        "email.send.yaml",
        (
            "  recheck_authorization: true\n",
            "  recheck_authorization: true\n  approval: always\n",
        ),
        &[],
    );
    check_edit(
        set,
        ("  version_precondition: expected_version\n", ""),
        &["warning no-version-precondition downstream.version_precondition"],
    );
    // Read tools have no key, no fingerprint and no retention to review.
    check_edit(
        "tickets.get.yaml",
        (
            "effect_class: read",
            "effect_class: read\nrequest_fingerprint:\n  fields: [\"*\"]",
        ),
        &[],
    );
}

#[test]
fn errors_sort_before_warnings() {
    // `no-purpose` (a warning) is raised before `no-retention` (an error) but listed after it.
    let text = read("tickets.create.yaml")
        .replacen("purpose: Create one support ticket for one validated workflow step.\n", "", 1)
        .replacen("retention:\n  record_ttl: 7d\n  tombstone_ttl: 30d\n  late_arrival: reject\n  max_retry_window: 1d\n", "", 1);
    assert_eq!(
        findings(&text, "t"),
        ["error no-retention retention", "warning no-purpose purpose"]
    );
}
