//! `idemgate-conformance`: the fault matrix's scenario list, a run narrowed by `--only`, and a
//! filter that selects nothing.

use std::process::Command;

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs the runner with `args`, expects the exit status, and expects every fragment of `stdout`
/// (and of `stderr`) to appear in that stream.
fn check(args: &[&str], code: i32, stdout: &[&str], stderr: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_idemgate-conformance"))
        .args(args)
        .output()
        .unwrap();
    let r = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
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

#[test]
fn conformance_lists_the_scenario_names() {
    let names: Vec<&str> = idemgate_conformance::scenarios::all()
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    let listed = check(&["--list"], 0, &[], &[]);
    assert_eq!(listed.stdout.lines().collect::<Vec<_>>(), names);
    // `--only` narrows the list as it narrows a run.
    let one = names[0];
    let narrowed = check(&["--list", "--only", one], 0, &[one], &[]);
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
        &["--only", first],
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
        &["--only", "no_such_scenario"][..],
        &["--list", "--only", "no_such_scenario"][..],
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
