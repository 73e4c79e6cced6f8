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
            "ledger.append.yaml:11: error[load] effect_class: `non_idempotent` tools are refused",
            "1 contract checked: 3 errors, 0 warnings",
        ],
        &[],
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
            "refunds.issue.yaml:29: error[load] retention.max_retry_window:",
        ],
        &[],
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
fn lint_json_lists_findings_with_their_file() {
    let bad = contract("bad/webhooks.notify.yaml");
    let r = check(
        &[
            "contract",
            "lint",
            "--format",
            "json",
            &contract("tickets.get.yaml"),
            &bad,
        ],
        1,
        &[],
        &[],
    );
    let findings: Value = serde_json::from_str(&r.stdout).unwrap();
    let rows: Vec<String> = findings
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
    assert!(findings[0]["reason"].as_str().unwrap().contains("tenant"));
    // A clean run is an empty array, not nothing.
    let r = check(
        &[
            "contract",
            "lint",
            "--format",
            "json",
            &contract("tickets.get.yaml"),
        ],
        0,
        &[],
        &[],
    );
    assert_eq!(
        serde_json::from_str::<Value>(&r.stdout).unwrap(),
        serde_json::json!([])
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
        ),
        (
            "type.yaml",
            text.replace("deduplicates_by_key: true", "deduplicates_by_key: often"),
            "error[parse] downstream.deduplicates_by_key: invalid type",
        ),
        (
            "syntax.yaml",
            text.replace("purpose: Create one", "purpose: Create: one"),
            "syntax.yaml:6: error[parse] mapping values are not allowed",
        ),
        (
            "nameless.yaml",
            text.replace("name: tickets.create\n", ""),
            "error[parse] name: missing field `name`",
        ),
    ];
    for (name, content, expect) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        check(
            &["contract", "lint", path.to_str().unwrap()],
            1,
            &[expect, "1 contract checked: 1 error, 0 warnings"],
            &[],
        );
    }
    let missing = dir.path().join("missing.yaml");
    check(
        &["contract", "lint", missing.to_str().unwrap()],
        1,
        &["missing.yaml: error[read] cannot read the file"],
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

#[test]
fn conformance_lists_the_scenario_names() {
    let names: Vec<&str> = idemgate_conformance::scenarios::all()
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    let listed = check(&["conformance", "--list"], 0, &[], &[]);
    assert_eq!(listed.stdout.lines().collect::<Vec<_>>(), names);
    // `--only` narrows the list as it narrows a run.
    let one = names[0];
    let narrowed = check(&["conformance", "--list", "--only", one], 0, &[one], &[]);
    assert!(
        narrowed.stdout.lines().all(|l| l.contains(one)),
        "{}",
        narrowed.stdout
    );
}

#[test]
fn conformance_only_runs_the_scenarios_it_names() {
    let first = idemgate_conformance::scenarios::all()[0].0;
    let matching = idemgate_conformance::scenarios::all()
        .iter()
        .filter(|(name, _)| name.contains(first))
        .count();
    check(
        &["conformance", "--only", first],
        0,
        &[
            &format!("pass  {first}"),
            &format!("{matching} passed, 0 failed"),
        ],
        &[],
    );
}

#[test]
fn conformance_only_matching_nothing_fails_naming_the_filter() {
    for args in [
        &["conformance", "--only", "no_such_scenario"][..],
        &["conformance", "--list", "--only", "no_such_scenario"][..],
    ] {
        let r = check(
            args,
            2,
            &[],
            &[
                "no conformance scenario's name contains `no_such_scenario`",
                "idemgate conformance --list",
            ],
        );
        assert!(!r.stdout.contains("passed"), "nothing ran: {}", r.stdout);
    }
}
