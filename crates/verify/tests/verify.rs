//! `verify` against fake downstreams that count their own effects, one per way a system of
//! record can behave: every verdict is held against what the downstream really did, and no
//! run makes more effects than its budget.

use std::collections::HashMap;
use std::path::PathBuf;

use idemgate_core::lint::Decision;
use idemgate_verify::testing::{
    Behaviour, Changed, Claims, Dedup, FakeService, Hook, LookupMode, contract_at,
};
use idemgate_verify::{Claim, ContractReport, Error, Options, Report, Target, Verdict};

struct Run {
    report: Report,
    _dir: tempfile::TempDir,
}

impl Run {
    fn contract(&self) -> &ContractReport {
        &self.report.contracts[0]
    }

    fn claim(&self, claim: Claim) -> Verdict {
        self.contract()
            .claims
            .iter()
            .find(|c| c.claim == claim)
            .unwrap()
            .verdict
    }

    fn probe(&self, id: &str) -> &idemgate_verify::Finding {
        self.contract()
            .probes
            .iter()
            .find(|f| f.probe == id)
            .unwrap()
    }

    fn decision(&self) -> Decision {
        self.contract().decision.verified.decision
    }
}

fn write(dir: &tempfile::TempDir, yaml: &str) -> PathBuf {
    let path = dir.path().join("tool.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

async fn verify(yaml: &str, base_url: Option<&str>, options: Options) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, yaml);
    let run = idemgate_verify::run_id();
    let target = Target::load(&path, base_url, None, &run).unwrap();
    let report = idemgate_verify::verify(&[target], &options, &run)
        .await
        .unwrap();
    Run { report, _dir: dir }
}

/// What every run must satisfy whatever the downstream does: the effects the report counts
/// are the effects the downstream made (never more than the budget), every one under a key
/// of the run, and the markdown and JSON forms carry every probe.
fn invariants(run: &Run, fake: &FakeService, budget: u32) {
    let effects = fake.effects();
    assert!(
        effects.len() as u32 <= budget,
        "{} effects, budget {budget}",
        effects.len()
    );
    assert!(run.report.effects <= budget);
    for e in &effects {
        let key = e.key.as_deref().unwrap_or_default();
        assert!(
            key.contains(&format!(":verify-{}-", run.report.run)),
            "an effect under a key that is not the run's: {key}"
        );
    }
    // Each effect at the downstream was a request the run counted (a deduplicated repeat is
    // counted by the run but makes no effect).
    assert!(run.report.effects as usize >= effects.len());
    let markdown = run.report.markdown();
    let json = serde_json::to_value(&run.report).unwrap();
    for finding in &run.contract().probes {
        assert!(
            markdown.contains(&format!("(`{}`)", finding.probe)),
            "{markdown}"
        );
    }
    assert_eq!(
        json["contracts"][0]["probes"].as_array().unwrap().len(),
        run.contract().probes.len()
    );
}

/// Verifies the service's own contract claiming `claims`, with the default options.
async fn verify_fake(fake: &FakeService, claims: Claims) -> Run {
    verify(
        &fake.contract("tickets.create", claims),
        None,
        Options::default(),
    )
    .await
}

/// The downstream made at most one effect under any key.
fn one_effect_per_key(fake: &FakeService) {
    for (key, n) in fake.per_key() {
        assert_eq!(n, 1, "{key}");
    }
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
async fn an_honest_deduplicating_downstream_confirms_every_claim() {
    let fake = FakeService::start(Behaviour::honest()).await;
    let run = verify_fake(&fake, claims(true, true)).await;
    for claim in [
        Claim::Reference,
        Claim::DeduplicatesByKey,
        Claim::ReceiptLookup,
        Claim::AuthorizationHook,
        Claim::Recovery,
        Claim::OneEffectPerKey,
    ] {
        assert_eq!(
            run.claim(claim),
            Verdict::Confirmed,
            "{claim:?}: {:#?}",
            run.contract().claims
        );
    }
    assert_eq!(run.report.refuted, 0);
    assert_eq!(run.decision(), Decision::Automate);
    // With the default budget every probe ran.
    for finding in &run.contract().probes {
        assert!(!finding.observed.starts_with("skipped"), "{finding:?}");
    }
    // One effect per key at the downstream, whatever was repeated, dropped or broken.
    one_effect_per_key(&fake);
    invariants(&run, &fake, 10);
    // The lost answer's key: one effect at the downstream, and the report names it.
    let lost = run.probe("lost-answer");
    let key = &lost.evidence.keys[0];
    assert_eq!(fake.effects_for(key), 1);
    let reference = fake
        .effects()
        .into_iter()
        .find(|e| e.key.as_ref() == Some(key))
        .unwrap()
        .reference;
    assert!(lost.observed.contains(&reference), "{}", lost.observed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downstream_that_does_not_deduplicate_refutes_the_claim_that_it_does() {
    let fake = FakeService::start(Behaviour::plain()).await;
    let run = verify_fake(&fake, claims(true, false)).await;
    assert_eq!(run.claim(Claim::DeduplicatesByKey), Verdict::Refuted);
    // The lost answer was resent under the same key, as the contract allowed: two effects.
    assert_eq!(run.claim(Claim::Recovery), Verdict::Refuted);
    assert_eq!(run.decision(), Decision::KeepManual);
    assert!(run.report.refuted >= 2);
    // The refutation's evidence names the two tickets the downstream really made.
    let resend = run.probe("same-key-resend");
    assert_eq!(resend.verdict, Verdict::Refuted);
    let key = &resend.evidence.keys[0];
    let made: Vec<String> = fake
        .effects()
        .into_iter()
        .filter(|e| e.key.as_ref() == Some(key))
        .map(|e| e.reference)
        .collect();
    // The first effect, the resend, and later the changed request's resend: three tickets
    // under one key; the resend's refutation names the first two.
    assert_eq!(made.len(), 3, "{made:?}");
    for reference in &made[..2] {
        assert!(resend.observed.contains(reference), "{}", resend.observed);
    }
    let statuses: Vec<u16> = resend
        .evidence
        .exchanges
        .iter()
        .filter_map(|e| e.upstream.first().and_then(|u| u.status))
        .collect();
    // The probe's own exchange: the resend, answered 201 like the first effect was.
    assert_eq!(statuses, vec![201]);
    let lost = run.probe("lost-answer");
    assert_eq!(fake.effects_for(&lost.evidence.keys[0]), 2);
    invariants(&run, &fake, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_that_finds_nothing_after_a_commit_is_refuted() {
    let fake = FakeService::start(Behaviour {
        lookup: LookupMode::Blind,
        dedup: Dedup::Off,
        ..Behaviour::honest()
    })
    .await;
    let run = verify_fake(&fake, claims(false, true)).await;
    assert_eq!(run.claim(Claim::ReceiptLookup), Verdict::Refuted);
    let lookup = run.probe("receipt-lookup");
    assert!(
        lookup.observed.contains("found nothing after"),
        "{}",
        lookup.observed
    );
    // The lost answer could not be settled by the lookup the contract promised: `unknown`,
    // and — the downstream not deduplicating — never sent again.
    let lost = run.probe("lost-answer");
    assert_eq!(lost.verdict, Verdict::Refuted);
    assert_eq!(fake.effects_for(&lost.evidence.keys[0]), 1);
    assert_eq!(run.decision(), Decision::KeepManual);
    // Not claimed, so never tried: no resend of a used key reached the downstream.
    assert_eq!(run.claim(Claim::DeduplicatesByKey), Verdict::NotChecked);
    one_effect_per_key(&fake);
    invariants(&run, &fake, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downstream_that_accepts_a_changed_request_under_a_used_key_is_refuted() {
    let fake = FakeService::start(Behaviour {
        changed: Changed::NewEffect,
        ..Behaviour::honest()
    })
    .await;
    let run = verify_fake(&fake, claims(true, true)).await;
    let changed = run.probe("changed-request-resend");
    assert_eq!(changed.verdict, Verdict::Refuted);
    assert!(
        changed.observed.contains("accepted a changed request"),
        "{}",
        changed.observed
    );
    assert_eq!(fake.effects_for(&changed.evidence.keys[0]), 2);
    assert_eq!(run.claim(Claim::DeduplicatesByKey), Verdict::Refuted);
    // Through idemgate the changed request never reached the downstream.
    assert_eq!(run.probe("changed-request").verdict, Verdict::Confirmed);
    assert_eq!(run.probe("changed-request").evidence.fingerprints.len(), 2);
    invariants(&run, &fake, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_service_is_followed_to_its_end() {
    let fake = FakeService::start(Behaviour::honest()).await;
    let yaml = fake.contract(
        "reports.generate",
        Claims {
            dedup: true,
            jobs: true,
            ..Claims::default()
        },
    );
    let run = verify(&yaml, None, Options::default()).await;
    assert_eq!(
        run.claim(Claim::AsyncJobs),
        Verdict::Confirmed,
        "{:#?}",
        run.contract().probes
    );
    assert_eq!(run.claim(Claim::Reference), Verdict::Confirmed);
    assert_eq!(run.claim(Claim::DeduplicatesByKey), Verdict::Confirmed);
    assert_eq!(
        run.claim(Claim::Recovery),
        Verdict::Confirmed,
        "{:#?}",
        run.contract().probes
    );
    let first = run.probe("first-effect");
    assert!(
        first.observed.contains("202 with job `job-1`"),
        "{}",
        first.observed
    );
    assert!(first.observed.contains("report-1"), "{}", first.observed);
    for (key, n) in fake.per_key() {
        assert_eq!(n, 1, "{key}: one job per key");
    }
    invariants(&run, &fake, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downstream_that_answers_malformed_bodies_refutes_the_reference() {
    let fake = FakeService::start(Behaviour {
        malformed: true,
        ..Behaviour::honest()
    })
    .await;
    let run = verify_fake(&fake, claims(true, true)).await;
    assert_eq!(run.claim(Claim::Reference), Verdict::Refuted);
    let first = run.probe("first-effect");
    assert!(
        first
            .observed
            .contains("200 with no usable reference at `/ticket_id`"),
        "{}",
        first.observed
    );
    // Never taken for success from the broken answer: idemgate settled it by the lookup, to
    // the one ticket the downstream made.
    let key = &first.evidence.keys[0];
    assert_eq!(fake.effects_for(key), 1);
    let ticket = fake
        .effects()
        .into_iter()
        .find(|e| e.key.as_ref() == Some(key))
        .unwrap();
    for answer in &first.evidence.answers {
        assert_eq!(
            answer.reference.as_ref(),
            Some(&ticket.reference),
            "{answer:?}"
        );
    }
    assert_eq!(run.decision(), Decision::KeepManual);
    invariants(&run, &fake, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_honest_contract_for_a_plain_downstream_is_confirmed_and_stays_manual() {
    let fake = FakeService::start(Behaviour::plain()).await;
    let run = verify_fake(&fake, claims(false, false)).await;
    assert_eq!(run.report.refuted, 0, "{:#?}", run.contract().claims);
    // A lost, a 5xx and a malformed answer each end `unknown`, sent once.
    for id in ["lost-answer", "server-error", "malformed-answer"] {
        let finding = run.probe(id);
        assert_eq!(finding.verdict, Verdict::Confirmed, "{finding:?}");
        assert_eq!(fake.effects_for(&finding.evidence.keys[0]), 1, "{id}");
    }
    assert_eq!(run.claim(Claim::Recovery), Verdict::Confirmed);
    assert_eq!(run.claim(Claim::DeduplicatesByKey), Verdict::NotChecked);
    // Nothing settles a lost answer: the seed's decision stays manual.
    assert_eq!(run.decision(), Decision::KeepManual);
    assert!(
        run.contract()
            .decision
            .verified
            .reason
            .contains("no-receipt-path")
    );
    one_effect_per_key(&fake);
    invariants(&run, &fake, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budget_bounds_the_effects_and_says_what_it_skipped() {
    let fake = FakeService::start(Behaviour::honest()).await;
    let options = Options {
        budget: 3,
        ..Options::default()
    };
    let run = verify(
        &fake.contract("tickets.create", claims(true, true)),
        None,
        options,
    )
    .await;
    invariants(&run, &fake, 3);
    let skipped: Vec<&str> = run
        .contract()
        .probes
        .iter()
        .filter(|f| f.observed.contains("raise --budget"))
        .map(|f| f.probe)
        .collect();
    assert!(skipped.contains(&"concurrent-resends"), "{skipped:?}");
    // Unchecked claims count as unclaimed in the decision.
    assert_eq!(run.report.refuted, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downstream_that_deduplicates_only_one_request_at_a_time_is_refuted() {
    let fake = FakeService::start(Behaviour {
        dedup: Dedup::Racy,
        ..Behaviour::honest()
    })
    .await;
    let run = verify_fake(&fake, claims(true, true)).await;
    assert_eq!(run.probe("same-key-resend").verdict, Verdict::Confirmed);
    let concurrent = run.probe("concurrent-resends");
    assert_eq!(concurrent.verdict, Verdict::Refuted, "{concurrent:?}");
    assert_eq!(fake.effects_for(&concurrent.evidence.keys[0]), 2);
    // Through idemgate the same race makes one effect.
    assert_eq!(
        run.probe("concurrent-deliveries").verdict,
        Verdict::Confirmed
    );
    assert_eq!(
        fake.effects_for(&run.probe("concurrent-deliveries").evidence.keys[0]),
        1
    );
    invariants(&run, &fake, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_authorization_hook_must_deny_an_actor_it_does_not_know() {
    for (hook, verdict) in [
        (Hook::Strict, Verdict::Confirmed),
        (Hook::AllowAll, Verdict::Refuted),
    ] {
        let fake = FakeService::start(Behaviour {
            hook,
            ..Behaviour::honest()
        })
        .await;
        let run = verify_fake(&fake, claims(true, true)).await;
        assert_eq!(run.claim(Claim::AuthorizationHook), verdict, "{hook:?}");
        let asked: Vec<String> = fake
            .hook_asked()
            .iter()
            .filter_map(|b| b["actor"].as_str().map(str::to_string))
            .collect();
        assert!(
            asked
                .iter()
                .any(|a| a.starts_with("idemgate-verify-unknown-")),
            "{asked:?}"
        );
        // The hook is asked about fingerprints, never given the arguments.
        assert!(
            fake.hook_asked()
                .iter()
                .all(|b| b.get("arguments").is_none())
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_goes_to_a_production_url_unless_the_user_names_where() {
    let fake = FakeService::start(Behaviour::honest()).await;
    let yaml = contract_at(
        "https://tickets.example.com",
        "tickets.create",
        claims(true, true),
    );
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, &yaml);
    let refused = Target::load(&path, None, None, "r1").unwrap_err();
    assert!(matches!(refused, Error::NotLoopback { .. }), "{refused}");
    assert!(refused.to_string().contains("--base-url"), "{refused}");
    assert!(fake.effects().is_empty());
    // Named: every URL on the contract's origin moves there, the hook included.
    let run = verify(&yaml, Some(&fake.url()), Options::default()).await;
    assert_eq!(run.report.refuted, 0, "{:#?}", run.contract().claims);
    assert_eq!(run.contract().base_url, fake.url());
    assert!(!fake.hook_asked().is_empty());
    assert!(!fake.effects().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_contracts_share_one_budget() {
    let honest = FakeService::start(Behaviour::honest()).await;
    let plain = FakeService::start(Behaviour::plain()).await;
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.yaml");
    let b = dir.path().join("b.yaml");
    std::fs::write(&a, honest.contract("tickets.create", claims(true, true))).unwrap();
    std::fs::write(&b, plain.contract("tickets.plain", claims(false, false))).unwrap();
    let run = idemgate_verify::run_id();
    let targets = vec![
        Target::load(&a, None, None, &run).unwrap(),
        Target::load(&b, None, None, &run).unwrap(),
    ];
    let options = Options {
        budget: 12,
        ..Options::default()
    };
    let plan = idemgate_verify::plan(&targets, &options, &run);
    assert!(plan.contains("at most 12 effects"), "{plan}");
    assert!(
        plan.contains(&honest.url()) && plan.contains(&plain.url()),
        "{plan}"
    );
    let report = idemgate_verify::verify(&targets, &options, &run)
        .await
        .unwrap();
    let made = honest.effects().len() + plain.effects().len();
    assert!(
        made <= 12 && report.effects <= 12,
        "{made} / {}",
        report.effects
    );
    let per_contract: HashMap<&str, u32> = report
        .contracts
        .iter()
        .map(|c| (c.tool.as_str(), c.effects))
        .collect();
    assert_eq!(per_contract.values().sum::<u32>(), report.effects);
}
