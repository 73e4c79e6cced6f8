//! `idemgate verify` as a user runs it: the binary against fake downstreams that count their
//! own effects — its exit status, its report (text, JSON, markdown), and never more effects
//! at the downstream than the budget.

mod support;

use idemgate_verify::testing::{Behaviour, Claims, FakeService, contract_at};
use serde_json::Value;
use support::idemgate;

/// `idemgate verify ARGS`, off the test's runtime threads (the fake must answer meanwhile).
async fn verify(args: Vec<String>) -> support::Run {
    tokio::task::spawn_blocking(move || {
        let mut all = vec!["verify"];
        all.extend(args.iter().map(String::as_str));
        idemgate(None, None, &all)
    })
    .await
    .unwrap()
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// The service's own contract claiming `claims`, written to a temporary directory.
fn contract_file(fake: &FakeService, claims: Claims) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "tickets.yaml",
        &fake.contract("tickets.create", claims),
    );
    (dir, path)
}

fn claim<'a>(report: &'a Value, name: &str) -> &'a str {
    report["contracts"][0]["claims"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["claim"] == name)
        .unwrap_or_else(|| panic!("no claim {name}: {report}"))["verdict"]
        .as_str()
        .unwrap()
}

fn claims(dedup: bool, lookup: bool) -> Claims {
    Claims {
        dedup,
        lookup,
        hook: true,
        ..Claims::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_honest_contract_exits_0_with_its_evidence_table() {
    let fake = FakeService::start(Behaviour::honest()).await;
    let (dir, contract) = contract_file(&fake, claims(true, true));
    let report = dir.path().join("tickets.verify.md");
    let run = verify(vec![
        contract.clone(),
        "--json".into(),
        "--report".into(),
        report.display().to_string(),
    ])
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    // Before the first effect: where effects go and how many at most.
    assert!(
        run.stderr
            .contains(&format!("effects to {}/tickets", fake.url())),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("at most 10 effects"), "{}", run.stderr);
    let json = run.json();
    assert_eq!(json["schema"], 1);
    assert_eq!(json["refuted"], 0);
    assert_eq!(claim(&json, "deduplicates_by_key"), "confirmed");
    assert_eq!(claim(&json, "receipt_lookup"), "confirmed");
    assert_eq!(
        json["contracts"][0]["decision"]["verified"]["decision"],
        "automate"
    );
    let effects = json["effects"].as_u64().unwrap() as usize;
    assert!(effects <= 10);
    assert!(fake.effects().len() <= effects);
    let markdown = std::fs::read_to_string(&report).unwrap();
    assert!(
        markdown.contains("| scenario | expected | observed | evidence to keep | verdict |"),
        "{markdown}"
    );
    assert!(markdown.contains("(`lost-answer`)"), "{markdown}");
    // Every effect is under one of the run's keys.
    let run_id = json["run"].as_str().unwrap();
    for effect in fake.effects() {
        assert!(effect.key.unwrap().contains(&format!(":verify-{run_id}-")));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refuted_claim_exits_1_and_names_the_two_effects() {
    let fake = FakeService::start(Behaviour::plain()).await;
    let (_dir, contract) = contract_file(&fake, claims(true, false));
    let run = verify(vec![contract, "--budget".into(), "4".into()]).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(fake.effects().len() <= 4, "{:?}", fake.effects());
    let line = run
        .stdout
        .lines()
        .find(|l| l.contains("deduplicates_by_key"))
        .unwrap_or_else(|| panic!("{}", run.stdout));
    assert!(line.trim_start().starts_with("refuted"), "{line}");
    // The two tickets the downstream made under the first key are named.
    let first = fake.effects()[0].key.clone().unwrap();
    let made: Vec<String> = fake
        .effects()
        .into_iter()
        .filter(|e| e.key.as_ref() == Some(&first))
        .map(|e| e.reference)
        .collect();
    // The first effect, its resend, and the changed request's resend.
    assert_eq!(made.len(), 3, "{made:?}");
    for reference in &made[..2] {
        assert!(line.contains(reference.as_str()), "{line}");
    }
    assert!(
        run.stdout
            .contains("keep manual until reconciliation exists"),
        "{}",
        run.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_production_url_needs_a_base_url_and_nothing_is_sent_before() {
    let fake = FakeService::start(Behaviour::honest()).await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = contract_at(
        "https://tickets.example.com",
        "tickets.create",
        claims(true, true),
    );
    let contract = write(&dir, "tickets.yaml", &yaml);
    let refused = verify(vec![contract.clone()]).await;
    assert_eq!(refused.code, 2, "{refused:?}");
    assert!(
        refused.stderr.contains("not a loopback address"),
        "{}",
        refused.stderr
    );
    assert!(refused.stderr.contains("--base-url"), "{}", refused.stderr);
    let dry = verify(vec![
        contract.clone(),
        "--base-url".into(),
        fake.url(),
        "--dry-run".into(),
    ])
    .await;
    assert_eq!(dry.code, 0, "{dry:?}");
    assert!(
        dry.stderr
            .contains(&format!("effects to {}/tickets", fake.url())),
        "{}",
        dry.stderr
    );
    assert!(fake.effects().is_empty(), "a dry run makes no effect");
    let run = verify(vec![contract, "--base-url".into(), fake.url()]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(!fake.effects().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_of_zero_makes_no_effect() {
    let fake = FakeService::start(Behaviour::honest()).await;
    let (_dir, contract) = contract_file(&fake, claims(true, true));
    let run = verify(vec![
        contract,
        "--budget".into(),
        "0".into(),
        "--json".into(),
    ])
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(fake.effects().is_empty());
    let json = run.json();
    assert_eq!(json["effects"], 0);
    let skipped = json["contracts"][0]["probes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["observed"].as_str().unwrap().contains("raise --budget"))
        .count();
    assert!(skipped >= 1, "{json}");
    // Nothing confirmed a path for a lost answer: the decision stays manual.
    assert_eq!(
        json["contracts"][0]["decision"]["verified"]["decision"],
        "keep manual until reconciliation exists"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_naming_what_is_wrong_before_any_effect() {
    let fake = FakeService::start(Behaviour::honest()).await;
    let (dir, contract) = contract_file(&fake, claims(true, true));
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["--args".into(), "{not json".into()], "--args"),
        (
            vec!["--args".into(), r#"{"subject": ""}"#.into()],
            "input schema",
        ),
        (
            vec!["--args".into(), r#"tickets.other={"subject": "x"}"#.into()],
            "tickets.other",
        ),
        (vec!["--concurrency".into(), "1".into()], "--concurrency"),
        (
            vec!["--probe-timeout".into(), "soon".into()],
            "--probe-timeout",
        ),
        (vec!["--tenant".into(), "a:b".into()], "--tenant"),
        (vec!["--base-url".into(), "ftp://x".into()], "--base-url"),
    ];
    for (extra, named) in cases {
        let mut args = vec![contract.clone()];
        args.extend(extra.clone());
        let run = verify(args).await;
        assert_eq!(run.code, 2, "{extra:?}: {run:?}");
        assert!(run.stderr.contains(named), "{extra:?}: {}", run.stderr);
    }
    let missing = verify(vec![dir.path().join("nope.yaml").display().to_string()]).await;
    assert_eq!(missing.code, 2);
    assert!(fake.effects().is_empty());
    // Arguments given per tool are the ones sent (a budget of 2: the first effect and the
    // executor's one resend it may need).
    let run = verify(vec![
        contract,
        "--args".into(),
        r#"tickets.create={"subject": "from the flag"}"#.into(),
        "--budget".into(),
        "2".into(),
    ])
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(fake.effects()[0].body["subject"], "from the flag");
}
