//! Fingerprints as data: fixed payloads with their exact canonical bytes and digests, properties
//! that say which argument objects are "the same operation", and a differential test of the
//! RFC 8785 canonicaliser against an independent implementation.

use std::path::Path;

use idemgate_core::canonical::{self, CANONICALIZATION_VERSION};
use idemgate_core::{Contract, Fingerprint, json};
use proptest::prelude::*;
use serde_json::{Map, Value};

fn load(name: &str) -> Contract {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../contracts")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    Contract::load(&text, name).unwrap_or_else(|e| panic!("{e}"))
}

fn fingerprint(contract: &Contract, arguments: &str) -> Fingerprint {
    let args = json::parse(arguments.as_bytes()).unwrap();
    contract
        .validate(&args)
        .unwrap_or_else(|e| panic!("{arguments}: {e}"));
    contract.fingerprint(&args).unwrap()
}

// ---------------------------------------------------------------------------------------------
// Old payloads kept as test vectors against new canonicalisation code.
//
// A change to any of these bytes or digests means a record stored earlier no longer matches a
// retry of the same operation: every such change needs a CANONICALIZATION_VERSION bump and a
// migration story, never a quiet update of the expected values. The digests were computed
// from the expected bytes with an independent tool (`printf '%s' BYTES | sha256sum`).

fn check_vector(arguments: &str, canonical: &str, digest: &str) {
    let c = load("tickets.create.yaml");
    let args = json::parse(arguments.as_bytes()).unwrap();
    c.validate(&args)
        .unwrap_or_else(|e| panic!("{arguments}: {e}"));
    let got = c.canonicalize(&args).unwrap();
    assert_eq!(got.as_str(), canonical, "{arguments}");
    assert_eq!(Fingerprint::of(&got).as_str(), digest, "{arguments}");
    assert_eq!(
        c.fingerprint(&args).unwrap().as_str(),
        digest,
        "{arguments}"
    );
}

#[test]
fn old_payloads_keep_their_fingerprints_under_canonicalization_v1() {
    assert_eq!(
        CANONICALIZATION_VERSION, 1,
        "a new version needs its own vectors beside these"
    );
    // The seed's example request; the queue is defaulted.
    check_vector(
        r#"{"subject": "Refund request", "body": "Customer reports a duplicate charge."}"#,
        r#"{"fields":{"body":"Customer reports a duplicate charge.","queue_id":"support","subject":"Refund request"},"tool":"tickets.create","tool_version":"2026-08-18"}"#,
        "sha256:d8be58003b71ee84cfdd4024ca01e6fb7eacf1f2e9b03f21f6e3b85d1dbd381a",
    );
    // Member order, a trimmed subject, an ignored trace id, a body kept byte for byte.
    check_vector(
        "{\"trace_id\":\"4bf92f3577b34da6\",\"body\":\"Please export my data.\\n\\nThanks\",\"subject\":\"  Data request \\n\",\"queue_id\":\"legal\"}",
        r#"{"fields":{"body":"Please export my data.\n\nThanks","queue_id":"legal","subject":"Data request"},"tool":"tickets.create","tool_version":"2026-08-18"}"#,
        "sha256:9a6a0b4dc993912bab02299e6cf9ef6babade328ab27f3a228db42a8ca07185d",
    );
    // Escapes in the input do not matter; JCS writes non-ASCII as UTF-8 and escapes only `"`,
    // `\` and control characters.
    check_vector(
        r#"{"queue_id":"billing","subject":"R\u00fcckerstattung \u2013 Bestellung #42 \ud83d\ude00","body":"quote \" backslash \\ tab \t bell \u0007 slash \/ euro \u20ac"}"#,
        "{\"fields\":{\"body\":\"quote \\\" backslash \\\\ tab \\t bell \\u0007 slash / euro \u{20ac}\",\"queue_id\":\"billing\",\"subject\":\"R\u{fc}ckerstattung \u{2013} Bestellung #42 \u{1f600}\"},\"tool\":\"tickets.create\",\"tool_version\":\"2026-08-18\"}",
        "sha256:807c6f98c7e77fa3bbcdae1173d13502344be1c79d64a947e9a119f4ce6959dd",
    );
    // The smallest request: an empty body is a value, not an absence.
    check_vector(
        r#"{"subject":"x","body":"","queue_id":"support"}"#,
        r#"{"fields":{"body":"","queue_id":"support","subject":"x"},"tool":"tickets.create","tool_version":"2026-08-18"}"#,
        "sha256:b2e1be1c6b19cf8ba942d0a8674383287e90fa359d1c750b1223bc2c8f4cce11",
    );
}

#[test]
fn fingerprints_read_back_and_refuse_other_forms() {
    let check = |text: &str, ok: bool| assert_eq!(Fingerprint::parse(text).is_ok(), ok, "{text}");
    check(
        "sha256:d8be58003b71ee84cfdd4024ca01e6fb7eacf1f2e9b03f21f6e3b85d1dbd381a",
        true,
    );
    check(
        "sha256:D8BE58003B71EE84CFDD4024CA01E6FB7EACF1F2E9B03F21F6E3B85D1DBD381A",
        false,
    );
    check(
        "sha256:d8be58003b71ee84cfdd4024ca01e6fb7eacf1f2e9b03f21f6e3b85d1dbd381",
        false,
    );
    check(
        "sha512:d8be58003b71ee84cfdd4024ca01e6fb7eacf1f2e9b03f21f6e3b85d1dbd381a",
        false,
    );
    check(
        "d8be58003b71ee84cfdd4024ca01e6fb7eacf1f2e9b03f21f6e3b85d1dbd381a",
        false,
    );
    check("", false);
}

#[test]
fn a_new_tool_version_is_a_new_fingerprint() {
    let c = load("tickets.create.yaml");
    let args = json::parse(br#"{"subject":"Refund request","body":"x"}"#).unwrap();
    let now = c.canonicalize(&args).unwrap();
    let then = c.canonicalize_as("2026-01-01", &args).unwrap();
    assert_eq!(
        then.as_str(),
        r#"{"fields":{"body":"x","queue_id":"support","subject":"Refund request"},"tool":"tickets.create","tool_version":"2026-01-01"}"#
    );
    assert_ne!(Fingerprint::of(&now), Fingerprint::of(&then));
    assert_eq!(Fingerprint::of(&now), c.fingerprint(&args).unwrap());
}

// ---------------------------------------------------------------------------------------------
// Properties of tickets.create: which argument objects are one operation.

/// Arguments as a caller might send them: an optional queue, a subject with whitespace around
/// it, a body, an optional trace id, members in any order.
#[derive(Debug, Clone)]
struct Args {
    queue: Option<String>,
    subject_core: String,
    pad: (String, String),
    body: String,
    trace: Option<String>,
    order: Vec<usize>,
}

impl Args {
    fn text(&self) -> String {
        let subject = format!("{}{}{}", self.pad.0, self.subject_core, self.pad.1);
        let mut members: Vec<Option<(&str, String)>> = vec![
            self.queue.clone().map(|q| ("queue_id", q)),
            Some(("subject", subject)),
            Some(("body", self.body.clone())),
            self.trace.clone().map(|t| ("trace_id", t)),
        ];
        let mut parts = Vec::new();
        for &i in &self.order {
            if let Some((name, value)) = members[i].take() {
                parts.push(format!("{}:{}", Value::from(name), Value::from(value)));
            }
        }
        format!("{{ {} }}", parts.join(" ,\n"))
    }

    /// What the contract says defines the operation: the queue (default `support`), the
    /// trimmed subject, the body as sent.
    fn meaning(&self) -> (String, String, String) {
        (
            self.queue.clone().unwrap_or_else(|| "support".into()),
            self.subject_core.trim().to_string(),
            self.body.clone(),
        )
    }
}

fn whitespace() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop::sample::select(vec![' ', '\t', '\n', '\r', '\u{3000}']),
        0..3,
    )
    .prop_map(|cs| cs.into_iter().collect())
}

/// Small pools so that equal and unequal meanings both turn up often.
fn args() -> impl Strategy<Value = Args> {
    (
        prop::option::of(prop::sample::select(vec![
            "support", "billing", "legal", "Support",
        ])),
        prop::sample::select(vec![
            "Refund request",
            "Refund  request",
            "refund request",
            "Login fails",
            "Ä",
        ]),
        (whitespace(), whitespace()),
        prop::sample::select(vec![
            "",
            "x",
            "x ",
            " x",
            "Customer reports a duplicate charge.",
        ]),
        prop::option::of("[a-f0-9]{8}"),
        Just(vec![0usize, 1, 2, 3]).prop_shuffle(),
    )
        .prop_map(|(queue, subject, pad, body, trace, order)| Args {
            queue: queue.map(str::to_string),
            subject_core: subject.to_string(),
            pad,
            body: body.to_string(),
            trace,
            order,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Same meaning ⇔ same fingerprint: member order, non-material fields, an omitted default
    /// and whitespace around the trimmed subject do not matter; everything else does.
    #[test]
    fn same_operation_iff_same_fingerprint(a in args(), b in args()) {
        let c = load("tickets.create.yaml");
        let (fa, fb) = (fingerprint(&c, &a.text()), fingerprint(&c, &b.text()));
        prop_assert_eq!(fa == fb, a.meaning() == b.meaning(), "{} / {}", a.text(), b.text());
    }

    /// Any change of a material value, to anything at all, changes the fingerprint.
    #[test]
    fn any_material_change_is_a_new_fingerprint(
        field in prop::sample::select(vec!["queue_id", "subject", "body"]),
        before in "\\PC{1,20}",
        after in "\\PC{1,20}",
    ) {
        let c = load("tickets.create.yaml");
        let base = serde_json::json!({"queue_id": "support", "subject": "Refund", "body": "x"});
        let (mut a, mut b) = (base.clone(), base);
        a[field] = Value::from(before.clone());
        b[field] = Value::from(after.clone());
        let same = if field == "subject" { before.trim() == after.trim() } else { before == after };
        prop_assume!(!same);
        prop_assert_ne!(c.fingerprint(&a).unwrap(), c.fingerprint(&b).unwrap());
    }

    /// The tool version is part of every fingerprint.
    #[test]
    fn any_version_change_is_a_new_fingerprint(a in args(), v1 in "[0-9a-z.-]{1,12}", v2 in "[0-9a-z.-]{1,12}") {
        prop_assume!(v1 != v2);
        let c = load("tickets.create.yaml");
        let args = json::parse(a.text().as_bytes()).unwrap();
        let f1 = Fingerprint::of(&c.canonicalize_as(&v1, &args).unwrap());
        let f2 = Fingerprint::of(&c.canonicalize_as(&v2, &args).unwrap());
        prop_assert_ne!(f1, f2);
    }
}

// ---------------------------------------------------------------------------------------------
// Differential: our RFC 8785 bytes against serde_jcs, an independent implementation, on strict
// values (integers within ±2^53, finite doubles, arbitrary strings and member names).

fn strict_value(doubles: bool) -> impl Strategy<Value = Value> {
    const SAFE: i64 = 1 << 53;
    let text = prop_oneof![
        "\\PC{0,12}",
        "[\\x00-\\x1f\"\\\\/]{0,6}",
        prop::sample::select(vec![
            "\u{20ac}",
            "\u{1f600}",
            "\u{fb33}",
            "\u{80}",
            "\u{f6}",
            "\r",
            "1",
            "\u{7f}",
            "\u{2028}"
        ])
        .prop_map(str::to_string),
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (-SAFE..=SAFE).prop_map(Value::from),
        (-1000i64..1000).prop_map(Value::from),
        text.clone().prop_map(Value::from),
        // Strict JSON has finite numbers only; without doubles this branch is another null.
        // Doubles of magnitude past 2^53 are refused by the strict parser (each is a whole
        // number that its neighbours share), so they are not strict values either.
        any::<f64>().prop_map(
            move |f| match doubles && f.is_finite() && f.abs() <= SAFE as f64 {
                true => Value::from(f),
                false => Value::Null,
            }
        ),
    ];
    leaf.prop_recursive(4, 64, 8, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec((text.clone(), inner), 0..6)
                .prop_map(|members| Value::Object(members.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn jcs_agrees_with_serde_jcs(value in strict_value(true)) {
        let ours = canonical::jcs(&value).unwrap();
        let theirs = serde_jcs::to_vec(&value).unwrap();
        prop_assert_eq!(String::from_utf8(ours).unwrap(), String::from_utf8(theirs).unwrap());
    }

    /// Without doubles (whose integral values come back as integers), canonical bytes read
    /// back strictly into the same value and canonicalise to themselves.
    #[test]
    fn jcs_bytes_read_back_as_the_same_value(value in strict_value(false)) {
        let ours = canonical::jcs(&value).unwrap();
        let back = json::parse(&ours).unwrap();
        prop_assert_eq!(&back, &value);
        prop_assert_eq!(canonical::jcs(&back).unwrap(), ours);
    }

    /// The text a caller sends, pretty or compact, canonicalises like the value it denotes.
    #[test]
    fn parsed_text_canonicalises_like_its_value(value in strict_value(false), pretty in any::<bool>()) {
        let text = if pretty { serde_json::to_string_pretty(&value) } else { serde_json::to_string(&value) }.unwrap();
        let parsed = json::parse(text.as_bytes()).unwrap();
        prop_assert_eq!(canonical::jcs(&parsed).unwrap(), serde_jcs::to_vec(&value).unwrap());
    }
}

/// Canonical bytes must themselves be strict JSON that canonicalises to the same bytes: a
/// stored canonical request is read back with the same strict parser (and the fuzz target
/// checks exactly this). Every input below is accepted by `json::parse`.
#[test]
fn canonical_bytes_parse_back_strictly() {
    let check = |input: &str| {
        let value = json::parse(input.as_bytes()).unwrap_or_else(|e| panic!("{input}: {e}"));
        let bytes = canonical::jcs(&value).unwrap();
        let text = String::from_utf8(bytes.clone()).unwrap();
        let back = json::parse(&bytes).unwrap_or_else(|e| {
            panic!("{input} canonicalises to {text}, which the strict parser refuses: {e}")
        });
        assert_eq!(canonical::jcs(&back).unwrap(), bytes, "{input}");
    };
    check("0.1");
    check("-0");
    check("9007199254740992");
    check("9007199254740992.0");
    check("[-1.5e-300, 123.456e-5, 4503599627370495.5]");
    // JCS writes doubles below 1e21 without an exponent (1e20 becomes a 21-digit integer
    // literal), so a parser that accepted them could not read its own canonical bytes back.
    // Every value of that magnitude is refused instead, whatever its spelling.
    for refused in [
        "1e20",
        "1e21",
        "1.5e300",
        "[-1e20]",
        "12345678901234567890.5",
        "9007199254740994.0",
    ] {
        let err = json::parse(refused.as_bytes()).unwrap_err();
        assert!(err.message.contains("beyond ±2^53"), "{refused}: {err}");
    }
}
