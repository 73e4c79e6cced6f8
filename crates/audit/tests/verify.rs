//! Offline verification of an exported log: a clean log verifies, and each kind of damage is
//! named at the first entry it breaks.

use std::sync::Arc;

use idemgate_audit::{Broken, Expect, PublicKey, SigningKey, verify};
use idemgate_core::audit::{Action, Draft, Entry, Head, Sealer};
use idemgate_core::fingerprint::Fingerprint;
use idemgate_core::key::OperationKey;
use idemgate_core::record::RecordStatus;

fn key() -> Arc<SigningKey> {
    Arc::new(SigningKey::parse("seed", &"42".repeat(32)).unwrap())
}

fn public() -> PublicKey {
    key().public()
}

/// Five entries, as a store seals them one after the other.
fn log(sealer: &Sealer) -> Vec<Entry> {
    let mut head = Head::GENESIS;
    (0..5)
        .map(|i| {
            let draft = Draft {
                at: 1_000 + i,
                key: OperationKey::parse(&format!("acme:prod:wf:s{i}")).unwrap(),
                tool: "tickets.create".into(),
                action: if i % 2 == 0 {
                    Action::Approved
                } else {
                    Action::Denied
                },
                actor: "alice".into(),
                reason: format!("reason {i}"),
                fingerprint: Fingerprint::parse(&format!("sha256:{}", "c".repeat(64))).unwrap(),
                status: if i % 2 == 0 {
                    RecordStatus::Pending
                } else {
                    RecordStatus::FailedPermanent
                },
                reference: None,
            };
            let entry = sealer.seal(&draft, head);
            head = entry.head().unwrap();
            entry
        })
        .collect()
}

fn text(entries: &[Entry]) -> String {
    entries
        .iter()
        .map(|e| serde_json::to_string(e).unwrap() + "\n")
        .collect()
}

fn check(entries: &[Entry], expect: Expect) -> Result<idemgate_audit::Report, Broken> {
    verify(text(entries).as_bytes(), expect)
}

/// The entry named and the words its problem must contain.
fn broken_at(result: Result<idemgate_audit::Report, Broken>, seq: u64, words: &str) {
    let broken = result.expect_err("verification must fail");
    assert_eq!(broken.seq, Some(seq), "{broken}");
    assert!(broken.problem.contains(words), "{broken}");
}

#[test]
fn a_clean_export_verifies() {
    let entries = log(&Sealer::signed(key()));
    let report = check(&entries, Expect::SignedBy(public())).unwrap();
    assert_eq!((report.entries, report.last_seq), (5, 5));
    assert_eq!(report.last_hash, entries[4].hash);
    assert_eq!(report.unsigned, 0);
}

#[test]
fn a_tampered_field_names_its_entry() {
    let mut entries = log(&Sealer::signed(key()));
    entries[2].reason = "nothing to see".into();
    broken_at(
        check(&entries, Expect::SignedBy(public())),
        3,
        "a field was changed",
    );
}

#[test]
fn a_tampered_field_with_its_hash_recomputed_fails_the_signature() {
    let mut entries = log(&Sealer::signed(key()));
    entries[2].actor = "mallory".into();
    entries[2].hash = entries[2].content_hash().unwrap();
    broken_at(
        check(&entries, Expect::SignedBy(public())),
        3,
        "signature does not verify",
    );
    // Without signatures, only the next entry's link shows it.
    broken_at(
        check(&entries, Expect::ChainOnly),
        4,
        "prev_hash does not match entry 3",
    );
}

#[test]
fn a_reordered_pair_is_out_of_sequence() {
    let mut entries = log(&Sealer::signed(key()));
    entries.swap(1, 2);
    broken_at(
        check(&entries, Expect::SignedBy(public())),
        3,
        "entry 2 is missing",
    );
    let mut entries = log(&Sealer::signed(key()));
    entries.swap(3, 4);
    broken_at(check(&entries, Expect::ChainOnly), 5, "entry 4 is missing");
}

#[test]
fn a_removed_middle_entry_is_named() {
    let mut entries = log(&Sealer::signed(key()));
    entries.remove(2);
    broken_at(
        check(&entries, Expect::SignedBy(public())),
        4,
        "entry 3 is missing",
    );
}

#[test]
fn a_renumbered_gap_breaks_the_link() {
    // Removing entry 3 and renumbering the next one hides the gap in the sequence, not in the
    // chain: the renumbered entry still links to the removed entry's hash.
    let mut entries = log(&Sealer::signed(key()));
    entries.remove(2);
    entries[2].seq = 3;
    broken_at(
        check(&entries, Expect::ChainOnly),
        3,
        "prev_hash does not match entry 2",
    );
}

#[test]
fn a_truncated_tail_verifies_but_reports_where_it_ends() {
    // A shorter log is a valid log: a file alone cannot show that entries were cut from its end.
    // The report says where it ends, for comparison with the store (`verify --expect-last`).
    let entries = log(&Sealer::signed(key()));
    let report = check(&entries[..3], Expect::SignedBy(public())).unwrap();
    assert_eq!(report.last_seq, 3);
    assert_ne!(report.last_seq, 5);
    // A line cut in half is no entry.
    let mut cut = text(&entries);
    cut.truncate(cut.len() - 40);
    let broken = verify(cut.as_bytes(), Expect::SignedBy(public())).unwrap_err();
    assert_eq!((broken.line, broken.seq), (5, None), "{broken}");
}

#[test]
fn a_wrong_key_fails_at_the_first_entry() {
    let entries = log(&Sealer::signed(key()));
    let other = SigningKey::parse("seed", &"17".repeat(32))
        .unwrap()
        .public();
    broken_at(
        check(&entries, Expect::SignedBy(other)),
        1,
        "signed by another key",
    );
    // An entry re-signed by another key but claiming the right one fails its signature.
    let mut forged = entries.clone();
    let impostor = Sealer::signed(Arc::new(
        SigningKey::parse("seed", &"17".repeat(32)).unwrap(),
    ));
    let mut e = impostor.seal(
        &Draft {
            at: 1,
            key: OperationKey::parse("acme:prod:wf:x").unwrap(),
            tool: "t".into(),
            action: Action::Denied,
            actor: "mallory".into(),
            reason: "r".into(),
            fingerprint: Fingerprint::parse(&format!("sha256:{}", "c".repeat(64))).unwrap(),
            status: RecordStatus::FailedPermanent,
            reference: None,
        },
        Head::GENESIS,
    );
    e.public_key = entries[0].public_key.clone();
    e.hash = e.content_hash().unwrap();
    forged[0] = e;
    broken_at(
        check(&forged, Expect::SignedBy(public())),
        1,
        "signature does not verify",
    );
}

#[test]
fn unsigned_entries_fail_under_a_key_and_are_counted_without_one() {
    let entries = log(&Sealer::unsigned());
    broken_at(check(&entries, Expect::SignedBy(public())), 1, "unsigned");
    let report = check(&entries, Expect::ChainOnly).unwrap();
    assert_eq!((report.entries, report.unsigned), (5, 5));
}

#[test]
fn a_log_that_does_not_start_at_genesis_is_refused() {
    let entries = log(&Sealer::signed(key()));
    broken_at(
        check(&entries[1..], Expect::SignedBy(public())),
        2,
        "entry 1 is missing",
    );
}

#[test]
fn keys_are_refused_with_what_is_wrong() {
    let short = SigningKey::parse("IDEMGATE_AUDIT_KEY", "abcd").unwrap_err();
    assert!(
        short
            .to_string()
            .contains("IDEMGATE_AUDIT_KEY must be 64 hex digits"),
        "{short}"
    );
    assert!(short.to_string().contains("it has 4 digits"), "{short}");
    let bad = PublicKey::parse("--public-key", &"zz".repeat(32)).unwrap_err();
    assert!(bad.to_string().contains("not hex digits"), "{bad}");
    let k = key();
    assert_eq!(
        PublicKey::parse("k", &k.public().to_string()).unwrap(),
        k.public()
    );
    assert_eq!(
        SigningKey::parse("k", &k.seed_hex()).unwrap().public(),
        k.public()
    );
}
