//! The built `idemgate` binary, run on the example and bad contracts: exit statuses and the
//! lines a person or a script relies on.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::Value;

/// The repository's `contracts/` folder, as a path the binary is given.
fn contracts() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../contracts")
}

fn contract(name: &str) -> String {
    contracts().join(name).display().to_string()
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run_with_stdin(args: &[&str], stdin: &str) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    Run {
        code: out.status.code().expect("exited, not killed"),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

fn run(args: &[&str]) -> Run {
    run_with_stdin(args, "")
}

/// Runs `args`, expects the exit status, and expects every fragment of `stdout` (and of
/// `stderr`) to appear in that stream.
fn check(args: &[&str], code: i32, stdout: &[&str], stderr: &[&str]) -> Run {
    let r = run(args);
    let shown = format!(
        "{args:?}\n--- exit {}\n--- stdout\n{}--- stderr\n{}",
        r.code, r.stdout, r.stderr
    );
    assert_eq!(r.code, code, "{shown}");
    for fragment in stdout {
        assert!(
            r.stdout.contains(fragment),
            "stdout lacks `{fragment}`\n{shown}"
        );
    }
    for fragment in stderr {
        assert!(
            r.stderr.contains(fragment),
            "stderr lacks `{fragment}`\n{shown}"
        );
    }
    r
}

// ---------------------------------------------------------------------------------------------
// contract lint

#[test]
fn lint_passes_the_examples() {
    let files: Vec<String> = [
        "tickets.create.yaml",
        "email.send.yaml",
        "tickets.set_status.yaml",
        "tickets.get.yaml",
        "reports.generate.yaml",
    ]
    .iter()
    .map(|f| contract(f))
    .collect();
    let mut args = vec!["contract", "lint"];
    args.extend(files.iter().map(String::as_str));
    let r = check(
        &args,
        0,
        &[
            "tickets.create.yaml: ok",
            "email.send.yaml: ok",
            "5 contracts checked: 0 errors, 0 warnings",
        ],
        &[],
    );
    assert_eq!(r.stderr, "");
}

#[test]
fn lint_flags_each_bad_contract() {
    let c = |f: &str| contract(&format!("bad/{f}"));
    check(
        &["contract", "lint", &c("ledger.append.yaml")],
        1,
        &[
            "ledger.append.yaml:11: error[non-idempotent-exposed] effect_class: a non_idempotent tool repeats its effect",
            "ledger.append.yaml: error[no-receipt-path] downstream:",
            // The loader refuses the same class; the fault is reported once.
            "1 contract checked: 2 errors, 0 warnings",
        ],
        &[],
    );
    assert!(
        !run(&["contract", "lint", &c("ledger.append.yaml")])
            .stdout
            .contains("error[load]")
    );
    check(
        &["contract", "lint", &c("messages.post.yaml")],
        1,
        &["error[fingerprint-over-everything] request_fingerprint.fields:"],
        &[],
    );
    check(
        &["contract", "lint", &c("payments.charge.yaml")],
        1,
        &[
            "`trace_id` describes the delivery",
            "`received_at` describes the delivery",
        ],
        &[],
    );
    check(
        &["contract", "lint", &c("webhooks.notify.yaml")],
        1,
        &[
            "error[key-without-tenant] operation_key.scope:",
            "error[no-receipt-path]",
        ],
        &[],
    );
    check(
        &["contract", "lint", &c("refunds.issue.yaml")],
        1,
        &[
            "error[retention-shorter-than-retry-window] retention:",
            "1 contract checked: 1 error, 0 warnings",
        ],
        &[],
    );
    assert!(
        !run(&["contract", "lint", &c("refunds.issue.yaml")])
            .stdout
            .contains("error[load]")
    );
    check(
        &["contract", "lint", &c("accounts.delete.yaml")],
        1,
        &[
            "error[irreversible-without-approval]",
            "warning[no-next-review] owner.next_review:",
            "3 errors, 1 warning",
        ],
        &[],
    );
}

#[test]
fn one_bad_file_among_good_ones_fails_the_run() {
    let (good, bad) = (
        contract("tickets.get.yaml"),
        contract("bad/webhooks.notify.yaml"),
    );
    check(
        &["contract", "lint", &good, &bad],
        1,
        &[
            "tickets.get.yaml: ok",
            "2 contracts checked: 2 errors, 0 warnings",
        ],
        &[],
    );
}

#[test]
fn warnings_alone_pass() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tickets.get.yaml");
    let text = std::fs::read_to_string(contracts().join("tickets.get.yaml")).unwrap();
    std::fs::write(&path, text.replace("  next_review: \"2027-02-01\"\n", "")).unwrap();
    check(
        &["contract", "lint", path.to_str().unwrap()],
        0,
        &["warning[no-next-review]", "0 errors, 1 warning"],
        &[],
    );
}

#[test]
fn lint_json_lists_each_files_findings_and_decision() {
    let bad = contract("bad/webhooks.notify.yaml");
    let good = contract("tickets.get.yaml");
    let r = check(
        &["contract", "lint", "--format", "json", &good, &bad],
        1,
        &[],
        &[],
    );
    let reviews: Value = serde_json::from_str(&r.stdout).unwrap();
    let reviews = reviews.as_array().unwrap();
    assert_eq!(reviews.len(), 2);
    assert_eq!(reviews[0]["file"], good.as_str());
    assert_eq!(reviews[0]["findings"], serde_json::json!([]));
    assert_eq!(reviews[0]["decision"], "automate");
    assert_eq!(reviews[1]["file"], bad.as_str());
    let rows: Vec<String> = reviews[1]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            format!(
                "{} {} {} {} {}",
                f["file"].as_str().unwrap(),
                f["line"],
                f["level"],
                f["rule"],
                f["field"]
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            format!(r#"{bad} 14 "error" "key-without-tenant" "operation_key.scope""#),
            format!(r#"{bad} null "error" "no-receipt-path" "downstream""#),
        ]
    );
    assert!(
        reviews[1]["findings"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("tenant")
    );
    assert_eq!(
        reviews[1]["decision"],
        "keep manual until reconciliation exists"
    );
    assert!(
        reviews[1]["reason"]
            .as_str()
            .unwrap()
            .contains("no-receipt-path")
    );
}

#[test]
fn lint_reports_files_that_do_not_parse_or_cannot_be_read() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(contracts().join("tickets.create.yaml")).unwrap();
    let cases = [
        (
            "unknown.yaml",
            text.replace("purpose:", "colour: blue\npurpose:"),
            "unknown.yaml:6: error[parse] colour: unknown field `colour`",
            "decision: fix the contract first — 1 error to fix first (parse): the gateway would refuse",
        ),
        (
            "type.yaml",
            text.replace("deduplicates_by_key: true", "deduplicates_by_key: often"),
            "error[parse] downstream.deduplicates_by_key: invalid type",
            "decision: fix the contract first",
        ),
        (
            "syntax.yaml",
            text.replace("purpose: Create one", "purpose: Create: one"),
            "syntax.yaml:6: error[parse] mapping values are not allowed",
            "syntax.yaml: decision: not reviewed",
        ),
        (
            "nameless.yaml",
            text.replace("name: tickets.create\n", ""),
            "error[parse] name: missing field `name`",
            "decision: fix the contract first",
        ),
    ];
    for (name, content, expect, decision) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        check(
            &["contract", "lint", path.to_str().unwrap()],
            1,
            &[expect, decision, "1 contract checked: 1 error, 0 warnings"],
            &[],
        );
    }
    let missing = dir.path().join("missing.yaml");
    check(
        &["contract", "lint", missing.to_str().unwrap()],
        1,
        &[
            "missing.yaml: error[read] cannot read the file",
            "missing.yaml: decision: not reviewed — the file cannot be read as a contract",
        ],
        &[],
    );
}

#[test]
fn lint_needs_a_file() {
    check(&["contract", "lint"], 2, &[], &["FILE"]);
    check(
        &[
            "contract",
            "lint",
            "--format",
            "xml",
            &contract("tickets.get.yaml"),
        ],
        2,
        &[],
        &["xml"],
    );
}

#[test]
fn lint_ends_each_contract_with_its_decision() {
    let cases = [
        ("tickets.get.yaml", "decision: automate — read"),
        (
            "tickets.set_status.yaml",
            "decision: automate — natural_idempotent",
        ),
        ("reports.generate.yaml", "decision: automate — key_based"),
        (
            "tickets.create.yaml",
            "decision: automate with approval — operations matching approval_when (queue_id)",
        ),
        (
            "email.send.yaml",
            "decision: automate with approval — irreversible: an operator approves every operation",
        ),
        (
            "bad/webhooks.notify.yaml",
            "decision: keep manual until reconciliation exists — 2 errors to fix first (no-receipt-path, key-without-tenant)",
        ),
        (
            "bad/messages.post.yaml",
            "decision: fix the contract first — 1 error to fix first (fingerprint-over-everything)",
        ),
    ];
    for (file, decision) in cases {
        let path = contract(file);
        let r = run(&["contract", "lint", &path]);
        let lines: Vec<&str> = r.stdout.lines().collect();
        // The decision is the file's last line, before the run's summary.
        let last = lines[lines.len() - 2];
        assert!(
            last.starts_with(&format!("{path}: {decision}")),
            "{file}: {last:?}\n{}",
            r.stdout
        );
        assert_eq!(
            lines.iter().filter(|l| l.contains(": decision: ")).count(),
            1,
            "{file}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// contract lint on drafts

/// `tickets.create.yaml` with `edits` applied, each a (from, to) that must occur.
fn tickets_create_with(edits: &[(&str, &str)]) -> String {
    let mut text = std::fs::read_to_string(contracts().join("tickets.create.yaml")).unwrap();
    for (from, to) in edits {
        assert!(
            text.contains(from),
            "`{from}` is not in tickets.create.yaml"
        );
        text = text.replacen(from, to, 1);
    }
    text
}

#[test]
fn a_draft_without_retention_owner_or_version_lists_each_and_the_decision() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("draft.yaml");
    std::fs::write(
        &path,
        tickets_create_with(&[
            ("version: \"2026-08-18\"\n", ""),
            (
                "retention:\n  record_ttl: 7d\n  tombstone_ttl: 30d\n  late_arrival: reject\n  max_retry_window: 1d\n",
                "",
            ),
            (
                "owner:\n  reconciliation: support-platform-oncall\n  next_review: \"2027-02-01\"\n  runbook: https://runbooks.example.com/tickets.create\n",
                "",
            ),
        ]),
    )
    .unwrap();
    let path = path.to_str().unwrap();
    let r = check(
        &["contract", "lint", path],
        1,
        &[
            "error[no-version] version:",
            "error[no-retention] retention:",
            "error[no-reconciliation-owner] owner.reconciliation:",
            "warning[no-next-review] owner.next_review:",
            &format!("{path}: decision: keep manual until reconciliation exists — "),
            "1 contract checked: 3 errors, 1 warning",
        ],
        &[],
    );
    assert!(!r.stdout.contains("error[parse]"), "{}", r.stdout);
}

#[test]
fn a_draft_that_does_not_parse_is_still_reviewed_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("seed.yaml");
    // Written the way the seed's design-review artifact is: fields this format does not
    // have, a scope as prose, an owner as a placeholder list, a key from the model, and no
    // material fields.
    let text = tickets_create_with(&[
        ("effect_class: key_based", "effect_class: key_based_create"),
        (
            "  supplied_by: application\n",
            "  supplied_by: model\n  derived_by: model\n",
        ),
        (
            "  scope: [tenant, environment, workflow_id, step_id]",
            "  scope: tenant + environment + workflow_id + step_id",
        ),
        ("  fields: [queue_id, subject, body]\n", ""),
        ("  defaults:\n    queue_id: support\n", ""),
        (
            "  normalize:\n    # The ticket service trims subjects itself; the body is kept byte for byte.\n    subject: [trim]\n",
            "",
        ),
        (
            "  reconciliation: support-platform-oncall",
            "  reconciliation: [team or person]",
        ),
        (
            "retention:\n  record_ttl: 7d\n",
            "retention:\n  rule: longer than the retry window\n",
        ),
        (
            "owner:\n",
            "tests: [duplicate_same_key, lost_response_after_commit]\nowner:\n",
        ),
    ]);
    std::fs::write(&path, &text).unwrap();
    let path = path.to_str().unwrap();
    let line = |needle: &str| text.lines().position(|l| l.contains(needle)).unwrap() + 1;
    check(
        &["contract", "lint", path],
        1,
        &[
            // What the reader could not take, each with its line, the rest still reviewed.
            &format!(
                "{path}:{}: error[parse] effect_class: unknown variant `key_based_create`",
                line("key_based_create")
            ),
            "reviewed as key_based",
            &format!(
                "{path}:{}: error[parse] operation_key.derived_by: unknown field `derived_by`",
                line("derived_by")
            ),
            &format!(
                "{path}:{}: error[parse] operation_key.scope: invalid type",
                line("scope: tenant +")
            ),
            &format!(
                "{path}:{}: error[parse] owner.reconciliation: invalid type",
                line("[team or person]")
            ),
            &format!(
                "{path}:{}: error[parse] retention.rule: unknown field `rule`",
                line("rule: longer")
            ),
            "error[parse] retention.record_ttl: missing field `record_ttl`; reviewed as if `retention` were not written",
            &format!(
                "{path}:{}: error[parse] tests: unknown field `tests`",
                line("tests: [")
            ),
            // The linter's red flags on what remains.
            "error[key-not-from-application] operation_key.supplied_by: the key is supplied by `model`",
            "error[key-without-tenant] operation_key.scope:",
            "error[no-material-fields] request_fingerprint.fields:",
            "error[no-reconciliation-owner] owner.reconciliation:",
            "error[no-retention] retention:",
            &format!("{path}: decision: keep manual until reconciliation exists — "),
        ],
        &[],
    );
    // Lines in the order they are written.
    let r = run(&["contract", "lint", path]);
    let parse_lines: Vec<usize> = r
        .stdout
        .lines()
        .filter(|l| l.contains("error[parse]"))
        .filter_map(|l| l.split(':').nth(1)?.parse().ok())
        .collect();
    let mut sorted = parse_lines.clone();
    sorted.sort();
    assert_eq!(parse_lines, sorted, "{}", r.stdout);
}

#[test]
fn lint_says_what_serve_would_refuse_in_the_http_section() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("url.yaml");
    std::fs::write(
        &path,
        tickets_create_with(&[(
            "url: http://127.0.0.1:9000/tickets\n",
            "url: http://127.0.0.1:9000/queues/{queue}/tickets\n",
        )]),
    )
    .unwrap();
    check(
        &["contract", "lint", path.to_str().unwrap()],
        1,
        &[
            "error[load] downstream.http.url: placeholder `{queue}` is not `operation_key` or a property of the input schema",
            "decision: fix the contract first — 1 error to fix first (load): the gateway would refuse",
        ],
        &[],
    );
}

#[test]
fn docs_contracts_md_lists_every_rule() {
    let doc = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/contracts.md"),
    )
    .unwrap();
    for rule in idemgate_core::lint::RULES {
        assert!(
            doc.contains(&format!("| `{rule}` |")),
            "docs/contracts.md lacks {rule}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// contract new

fn run_in(dir: &std::path::Path, args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    Run {
        code: out.status.code().expect("exited, not killed"),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// Every field of a drafted contract (outside the example input schema) has a comment: on the
/// line before it, or as the first line of its block.
fn every_field_is_commented(text: &str) {
    let lines: Vec<&str> = text.lines().collect();
    let mut in_schema = false;
    for (i, line) in lines.iter().enumerate() {
        let indent = line.len() - line.trim_start().len();
        let t = line.trim_start();
        if indent == 0 {
            in_schema = t.starts_with("input_schema:");
        }
        let is_field = !t.starts_with('#')
            && !t.starts_with('-')
            && t.split_once(':').is_some_and(|(k, _)| {
                !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            });
        if !is_field || indent > 4 || (in_schema && indent > 0) {
            continue;
        }
        let before = i > 0 && lines[i - 1].trim_start().starts_with('#');
        let first_child = lines
            .get(i + 1)
            .is_some_and(|next| next.trim_start().starts_with('#') && t.ends_with(':'));
        assert!(
            before || first_child,
            "line {}: `{line}` has no comment\n{text}",
            i + 1
        );
    }
}

/// A draft with its placeholders replaced, as its owner would.
fn filled(text: &str) -> String {
    text.replace("CHANGE-ME.invalid", "127.0.0.1:9000")
        .replace("CHANGE-ME-oncall", "billing-oncall")
}

/// The lines of `text`, outside comments, that carry the placeholder mark.
fn marked_lines(text: &str) -> Vec<u64> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with('#') && l.contains("CHANGE-ME"))
        .map(|(i, _)| i as u64 + 1)
        .collect()
}

#[test]
fn new_drafts_every_class_and_lint_flags_each_placeholder_until_it_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("read", "tickets.get", "read", "decision: automate — read"),
        (
            "natural_idempotent",
            "tickets.set_status",
            "natural_idempotent",
            "decision: automate — natural_idempotent",
        ),
        (
            "key_based",
            "tickets.create",
            "key_based",
            "decision: automate — key_based: one effect per operation key; the downstream deduplicates on the key and offers a receipt lookup",
        ),
        (
            "deduplicating",
            "payments.charge",
            "key_based",
            "decision: automate — key_based: one effect per operation key; the downstream deduplicates on the key;",
        ),
        (
            "job",
            "reports.generate",
            "key_based",
            "decision: automate — key_based: one effect per operation key; the downstream deduplicates on the key;",
        ),
        (
            "irreversible",
            "refunds.issue",
            "irreversible",
            "decision: automate with approval — irreversible",
        ),
    ];
    for (class, name, effect_class, decision) in cases {
        let out = dir.path().join(format!("{class}.yaml"));
        let out = out.to_str().unwrap();
        check(
            &["contract", "new", name, "--class", class, "--out", out],
            0,
            &[&format!("wrote {out}")],
            &[],
        );
        let text = std::fs::read_to_string(out).unwrap();
        assert!(text.contains(&format!("\nname: {name}\n")), "{text}");
        assert!(
            text.contains(&format!("\neffect_class: {effect_class}\n")),
            "{text}"
        );
        every_field_is_commented(&text);
        // As drafted: every line that carries the mark is one `placeholder` error, and there
        // is nothing else to say.
        let marked = marked_lines(&text);
        assert!(!marked.is_empty(), "{class}: no placeholder\n{text}");
        let r = check(&["contract", "lint", "--format", "json", out], 1, &[], &[]);
        let review: Value = serde_json::from_str(&r.stdout).unwrap();
        let findings = review[0]["findings"].as_array().unwrap();
        let rules: Vec<&str> = findings
            .iter()
            .map(|f| f["rule"].as_str().unwrap())
            .collect();
        assert!(
            rules.iter().all(|r| *r == "placeholder"),
            "{class}: {rules:?}"
        );
        let lines: Vec<u64> = findings
            .iter()
            .map(|f| f["line"].as_u64().unwrap())
            .collect();
        assert_eq!(lines, marked, "{class}\n{text}");
        assert_eq!(review[0]["decision"], "fix the contract first", "{class}");
        check(
            &["contract", "lint", out],
            1,
            &[
                "error[placeholder] owner.reconciliation: `CHANGE-ME` is a placeholder left from the draft",
                "error[placeholder] downstream.http.url:",
                &format!("{out}: decision: fix the contract first — "),
                "placeholders of the draft are still in place",
            ],
            &[],
        );
        // Replaced: clean, and the decision the class leads to.
        std::fs::write(out, filled(&text)).unwrap();
        let r = check(
            &["contract", "lint", out],
            0,
            &[
                &format!("{out}: ok"),
                &format!("{out}: {decision}"),
                "1 contract checked: 0 errors, 0 warnings",
            ],
            &[],
        );
        assert_eq!(r.stderr, "");
    }
}

#[test]
fn new_shapes_the_arguments_by_what_the_name_says() {
    let dir = tempfile::tempdir().unwrap();
    let draft = |name: &str, class: &str| {
        let out = dir.path().join(format!("{name}.{class}.yaml"));
        check(
            &[
                "contract",
                "new",
                name,
                "--class",
                class,
                "--out",
                out.to_str().unwrap(),
            ],
            0,
            &[],
            &[],
        );
        let text = std::fs::read_to_string(&out).unwrap();
        std::fs::write(&out, filled(&text)).unwrap();
        (out.to_str().unwrap().to_string(), text)
    };
    let property = |text: &str, p: &str| text.contains(&format!("\n    {p}:\n"));
    // A refund has a payment and an amount, not a recipient.
    let (refund, text) = draft("refunds.issue", "irreversible");
    for p in ["payment_id", "amount", "currency"] {
        assert!(property(&text, p), "{p}\n{text}");
    }
    assert!(!property(&text, "to") && !property(&text, "text"), "{text}");
    assert!(text.contains("purpose: Refund "), "{text}");
    assert!(
        text.contains("url: https://CHANGE-ME.invalid/refunds\n"),
        "{text}"
    );
    assert!(!text.contains("a irreversible"), "{text}");
    let r = check(
        &[
            "contract",
            "fingerprint",
            &refund,
            "--args",
            r#"{"payment_id": "pay_1", "amount": 500, "currency": "eur", "reason": "broken"}"#,
        ],
        0,
        &["tool              refunds.issue"],
        &[],
    );
    // The currency is normalised, and the reason is not material.
    assert!(
        r.stdout
            .contains(r#""fields":{"amount":500,"currency":"EUR","payment_id":"pay_1"}"#),
        "{}",
        r.stdout
    );
    // A message has a recipient and a text; a ticket a subject and a body.
    let (email, text) = draft("email.send", "key_based");
    assert!(property(&text, "to") && property(&text, "text"), "{text}");
    check(
        &[
            "contract",
            "fingerprint",
            &email,
            "--args",
            r#"{"to": " Ann@Example.org", "text": "hi"}"#,
        ],
        0,
        &["\"to\":\"ann@example.org\""],
        &[],
    );
    let (_, text) = draft("tickets.create", "key_based");
    assert!(
        property(&text, "subject") && property(&text, "body"),
        "{text}"
    );
    let (_, text) = draft("tickets.get", "read");
    assert!(property(&text, "ticket_id"), "{text}");
    // A name that says nothing: the arguments themselves are placeholders, reported as such.
    let out = dir.path().join("inventory.yaml");
    let out = out.to_str().unwrap();
    check(
        &[
            "contract",
            "new",
            "inventory.adjust",
            "--class",
            "key_based",
            "--out",
            out,
        ],
        0,
        &[],
        &[],
    );
    check(
        &["contract", "lint", out],
        1,
        &[
            "error[placeholder] purpose:",
            "error[placeholder] input_schema.properties.CHANGE-ME: `CHANGE-ME` is a placeholder left from the draft: replace it with the tool's own arguments",
            "error[placeholder] request_fingerprint.fields:",
        ],
        &[],
    );
}

#[test]
fn lint_reports_each_fault_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("window.yaml");
    std::fs::write(
        &path,
        tickets_create_with(&[("max_retry_window: 1d", "max_retry_window: 60d")]),
    )
    .unwrap();
    let r = check(
        &["contract", "lint", path.to_str().unwrap()],
        1,
        &[
            "error[retention-shorter-than-retry-window] retention:",
            "decision: fix the contract first — 1 error to fix first (retention-shorter-than-retry-window)",
            "1 contract checked: 1 error, 0 warnings",
        ],
        &[],
    );
    assert!(!r.stdout.contains("error[load]"), "{}", r.stdout);
    // A loader refusal no red flag covers is still reported.
    std::fs::write(
        &path,
        tickets_create_with(&[(
            "  fields: [queue_id, subject, body]",
            "  fields: [queue_id, subject, body, colour]",
        )]),
    )
    .unwrap();
    check(
        &["contract", "lint", path.to_str().unwrap()],
        1,
        &["error[load] request_fingerprint.fields:", "1 error"],
        &[],
    );
}

#[test]
fn contract_help_speaks_of_the_product() {
    for args in [
        &["contract", "--help"][..],
        &["contract", "lint", "--help"],
        &["contract", "new", "--help"],
    ] {
        let r = check(args, 0, &[], &[]);
        assert!(
            !r.stdout.to_lowercase().contains("seed"),
            "{args:?}\n{}",
            r.stdout
        );
    }
    check(
        &["contract", "lint", "--help"],
        0,
        &[
            "keep manual until reconciliation exists",
            "fix the contract first",
            "not reviewed",
        ],
        &[],
    );
    check(
        &["contract", "new", "--help"],
        0,
        &["CHANGE-ME", "deduplicating", "job", "irreversible"],
        &[],
    );
}

#[test]
fn new_writes_name_yaml_by_default_and_never_overwrites() {
    let dir = tempfile::tempdir().unwrap();
    let r = run_in(
        dir.path(),
        &["contract", "new", "tickets.close", "--class", "key_based"],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let path = dir.path().join("tickets.close.yaml");
    let first = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, "name: mine\n").unwrap();
    let again = run_in(
        dir.path(),
        &["contract", "new", "tickets.close", "--class", "read"],
    );
    assert_eq!(again.code, 2);
    assert!(
        again
            .stderr
            .contains("tickets.close.yaml exists; refusing to overwrite it"),
        "{}",
        again.stderr
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "name: mine\n");
    assert!(first.contains("name: tickets.close"));
}

#[test]
fn new_refuses_bad_names_classes_and_non_idempotent_tools() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.yaml");
    let out = out.to_str().unwrap();
    check(
        &[
            "contract",
            "new",
            "two words",
            "--class",
            "read",
            "--out",
            out,
        ],
        2,
        &[],
        &["\"two words\" is not a tool name"],
    );
    check(
        &[
            "contract",
            "new",
            "ledger.add",
            "--class",
            "non_idempotent",
            "--out",
            out,
        ],
        2,
        &[],
        &[
            "non_idempotent tools are refused",
            "key_based",
            "natural_idempotent",
        ],
    );
    check(
        &["contract", "new", "x", "--class", "sometimes", "--out", out],
        2,
        &[],
        &["sometimes", "key_based"],
    );
    check(
        &["contract", "new", "x", "--out", out],
        2,
        &[],
        &["--class"],
    );
    assert!(
        !std::path::Path::new(out).exists(),
        "nothing is written on a refusal"
    );
}

// ---------------------------------------------------------------------------------------------
// contract fingerprint

const SEED_ARGS: &str = r#"{"subject": " Refund request ", "body": "Customer reports a duplicate charge.", "trace_id": "t-1"}"#;
const SEED_CANONICAL: &str = r#"{"fields":{"body":"Customer reports a duplicate charge.","queue_id":"support","subject":"Refund request"},"tool":"tickets.create","tool_version":"2026-08-18"}"#;
/// The same vector as `old_payloads_keep_their_fingerprints_under_canonicalization_v1` in the
/// core's tests: a change here is a CANONICALIZATION_VERSION bump, not an update.
const SEED_FINGERPRINT: &str =
    "sha256:d8be58003b71ee84cfdd4024ca01e6fb7eacf1f2e9b03f21f6e3b85d1dbd381a";

#[test]
fn fingerprint_prints_canonical_bytes_and_digest() {
    let r = check(
        &[
            "contract",
            "fingerprint",
            &contract("tickets.create.yaml"),
            "--args",
            SEED_ARGS,
        ],
        0,
        &[],
        &[],
    );
    assert_eq!(
        r.stdout,
        format!(
            "tool              tickets.create\ntool_version      2026-08-18\ncanonicalization  1\ncanonical         {SEED_CANONICAL}\nfingerprint       {SEED_FINGERPRINT}\n"
        )
    );
    let r = check(
        &[
            "contract",
            "fingerprint",
            "--format",
            "json",
            &contract("tickets.create.yaml"),
            "--args",
            SEED_ARGS,
        ],
        0,
        &[],
        &[],
    );
    assert_eq!(
        serde_json::from_str::<Value>(&r.stdout).unwrap(),
        serde_json::json!({
            "tool": "tickets.create",
            "tool_version": "2026-08-18",
            "canonicalization_version": 1,
            "canonical": SEED_CANONICAL,
            "fingerprint": SEED_FINGERPRINT,
        })
    );
}

#[test]
fn fingerprint_reads_arguments_from_a_file_or_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("args.json");
    std::fs::write(&path, SEED_ARGS).unwrap();
    let at = format!("@{}", path.display());
    check(
        &[
            "contract",
            "fingerprint",
            &contract("tickets.create.yaml"),
            "--args",
            &at,
        ],
        0,
        &[SEED_FINGERPRINT],
        &[],
    );
    let r = run_with_stdin(
        &[
            "contract",
            "fingerprint",
            &contract("tickets.create.yaml"),
            "--args",
            "-",
        ],
        SEED_ARGS,
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains(SEED_FINGERPRINT), "{}", r.stdout);
}

#[test]
fn fingerprint_of_other_examples() {
    check(
        &[
            "contract",
            "fingerprint",
            &contract("email.send.yaml"),
            "--args",
            r#"{"to":" Ana@Example.com","subject":"Hi","body":"B"}"#,
        ],
        0,
        &[
            r#"canonical         {"fields":{"body":"B","subject":"Hi","to":"ana@example.com"},"tool":"email.send","tool_version":"3"}"#,
        ],
        &[],
    );
    check(
        &[
            "contract",
            "fingerprint",
            &contract("reports.generate.yaml"),
            "--args",
            r#"{"report_type":"usage","period_start":"2026-10-01","period_end":"2026-10-31"}"#,
        ],
        0,
        &[r#""format":"pdf""#, "fingerprint       sha256:"],
        &[],
    );
}

/// A secret in the arguments that no error message may repeat.
const SECRET: &str = "sk_live_9f8e7d6c5b4a";

#[test]
fn fingerprint_refuses_bad_input_with_status_2() {
    let t = contract("tickets.create.yaml");
    let cases: [(&str, &str); 6] = [
        (
            r#"{"subject": "x", "body": "#,
            "--args is not strict JSON: request body ends before the JSON value is complete (line 1",
        ),
        (
            r#"{"subject": "x", "subject": "y", "body": "z"}"#,
            "--args is not strict JSON: request body member name `subject` appears twice in one object",
        ),
        (
            r#"{"subject": "x", "body": "y", "n": 9007199254740993}"#,
            "--args is not strict JSON: request body a number is an integer beyond ±2^53",
        ),
        (
            r#"{"body": "sk_live_9f8e7d6c5b4a"}"#,
            "--args: arguments do not match the input schema of tickets.create 2026-08-18: at `/`: required property \"subject\" is missing",
        ),
        (
            r#"{"subject": "x", "body": "y", "token": "sk_live_9f8e7d6c5b4a"}"#,
            "at `/`: unexpected properties token",
        ),
        (
            r#"{"subject": "x", "body": "y", "queue_id": "sk_live_9f8e7d6c5b4a_and_much_longer_than_sixty_four_characters_in_all_xxxxxxxxx"}"#,
            "at `/queue_id`: longer than 64 characters",
        ),
    ];
    for (arguments, message) in cases {
        let r = check(
            &["contract", "fingerprint", &t, "--args", arguments],
            2,
            &[],
            &["idemgate: error: ", message],
        );
        assert_eq!(r.stdout, "", "nothing is fingerprinted for refused input");
        assert!(!r.stderr.contains(SECRET), "{}", r.stderr);
    }
}

#[test]
fn fingerprint_refuses_a_contract_that_does_not_load() {
    let ledger = contract("bad/ledger.append.yaml");
    check(
        &[
            "contract",
            "fingerprint",
            &ledger,
            "--args",
            r#"{"account_id":"a","amount_cents":5}"#,
        ],
        2,
        &[],
        &[
            "contract refused: ",
            "ledger.append.yaml:11: field `effect_class`: `non_idempotent` tools are refused",
        ],
    );
    check(
        &[
            "contract",
            "fingerprint",
            "no/such/contract.yaml",
            "--args",
            "{}",
        ],
        2,
        &[],
        &["cannot read contract no/such/contract.yaml"],
    );
    check(
        &[
            "contract",
            "fingerprint",
            &contract("tickets.create.yaml"),
            "--args",
            "@no/such/args.json",
        ],
        2,
        &[],
        &["cannot read --args from no/such/args.json"],
    );
    check(
        &["contract", "fingerprint", &contract("tickets.create.yaml")],
        2,
        &[],
        &["--args"],
    );
}

// ---------------------------------------------------------------------------------------------
// conformance

/// The fault matrix runner is its own binary: without it beside `idemgate`, `idemgate
/// conformance` says so and how to get it, instead of running nothing and passing.
#[test]
fn conformance_without_its_runner_beside_names_how_to_build_it() {
    let dir = tempfile::tempdir().unwrap();
    let alone = dir.path().join("idemgate");
    std::fs::copy(env!("CARGO_BIN_EXE_idemgate"), &alone).unwrap();
    let out = Command::new(&alone)
        .args(["conformance", "--list"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("`idemgate-conformance` is not beside")
            && stderr.contains("cargo build -p idemgate-conformance-run"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}
