//! The checker: reads a whole history and names every entry that breaks an invariant of
//! DESIGN §3, judged by what the fake downstream recorded on its own side (effects and
//! arrivals), never by what the gateway said about itself.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::history::Entry;

/// The invariants, by the name a violation carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Check {
    /// More than one effect at the downstream for one operation key.
    DuplicateEffect,
    /// An `applied` / `replayed` answer (or final read) whose reference is not the one effect
    /// the downstream performed for that key, or for a key with no effect at all.
    WrongReference,
    /// A `safe_to_repeat: true` answer for a key that had an effect, before or after it.
    UnsafeRepeat,
    /// `unknown` for a key no perform request of which ever reached the downstream, where
    /// the gateway could have proved it never ran: for a deduplicating tool always (recovery
    /// resends under the key); for one that does not deduplicate unless a process died or the
    /// database failed while the key was being delivered (then the durable "sending" mark may
    /// have been written with no request behind it, and a lookup miss proves nothing).
    NeedlessUnknown,
    /// After the workload stopped and recovery ran, the key is still in flight (or could not
    /// be read).
    Unsettled,
    /// A caller heard `applied` / `replayed`, and afterwards the key has no record: a receipt
    /// was lost (the store lost a committed write).
    RecordLost,
}

impl Check {
    pub const ALL: [Check; 6] = [
        Check::DuplicateEffect,
        Check::WrongReference,
        Check::UnsafeRepeat,
        Check::NeedlessUnknown,
        Check::Unsettled,
        Check::RecordLost,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Check::DuplicateEffect => "duplicate_effect",
            Check::WrongReference => "wrong_reference",
            Check::UnsafeRepeat => "unsafe_repeat",
            Check::NeedlessUnknown => "needless_unknown",
            Check::Unsettled => "unsettled",
            Check::RecordLost => "record_lost",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Violation {
    pub check: Check,
    pub key: String,
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.check.name(), self.key, self.detail)
    }
}

/// What the checker found, and how much it looked at.
#[derive(Debug, Default)]
pub struct Report {
    pub violations: Vec<Violation>,
    pub keys: usize,
    pub calls: usize,
    pub answers: BTreeMap<String, usize>,
    pub effects: usize,
    pub arrivals: usize,
    pub nemesis: usize,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }

    /// Which checks fired, each once.
    pub fn fired(&self) -> BTreeSet<Check> {
        self.violations.iter().map(|v| v.check).collect()
    }

    pub fn count(&self, check: Check) -> usize {
        self.violations.iter().filter(|v| v.check == check).count()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} keys, {} calls, {} effects, {} arrivals at the downstream, {} nemesis actions",
            self.keys, self.calls, self.effects, self.arrivals, self.nemesis
        )?;
        let answers: Vec<String> = self
            .answers
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        writeln!(f, "answers: {}", answers.join(", "))?;
        if self.ok() {
            return writeln!(f, "no violation");
        }
        for check in Check::ALL {
            let n = self.count(check);
            if n == 0 {
                continue;
            }
            writeln!(f, "{}: {n}", check.name())?;
            for v in self.violations.iter().filter(|v| v.check == check).take(5) {
                writeln!(f, "  {v}")?;
            }
        }
        Ok(())
    }
}

#[derive(Default)]
struct KeyView<'a> {
    tool: Option<&'a str>,
    first_invoke: Option<u64>,
    first_unknown: Option<u64>,
    effects: Vec<&'a str>,
    arrivals: usize,
    invoked: bool,
    /// (outcome, reference, safe_to_repeat) of every answer that came back.
    answers: Vec<(&'a str, Option<&'a str>, Option<bool>)>,
    /// (outcome, reference, error) of the final reads.
    finals: Vec<(Option<&'a str>, Option<&'a str>, Option<&'a str>)>,
}

fn is_success(outcome: &str) -> bool {
    outcome == "applied" || outcome == "replayed"
}

/// The member of the `meta` entry's settings that lists the tools whose downstream does not
/// deduplicate on the key.
pub const NON_DEDUPLICATING: &str = "non_deduplicating";

/// Checks a whole history.
pub fn check(entries: &[Entry]) -> Report {
    let mut report = Report::default();
    let mut keys: BTreeMap<&str, KeyView> = BTreeMap::new();
    let mut any_final = false;
    let mut non_dedup: BTreeSet<&str> = BTreeSet::new();
    let mut disruptions: Vec<u64> = Vec::new();
    for entry in entries {
        match entry {
            Entry::Meta { settings, .. } => {
                if let Some(tools) = settings[NON_DEDUPLICATING].as_array() {
                    non_dedup.extend(tools.iter().filter_map(|t| t.as_str()));
                }
            }
            Entry::Invoke { key, tool, at, .. } => {
                report.calls += 1;
                let view = keys.entry(key).or_default();
                view.invoked = true;
                view.tool.get_or_insert(tool);
                view.first_invoke.get_or_insert(*at);
            }
            Entry::Answer {
                at,
                key,
                outcome,
                reference,
                safe_to_repeat,
                ..
            } => {
                let label = outcome.as_deref().unwrap_or("no_answer");
                *report.answers.entry(label.to_string()).or_default() += 1;
                if let Some(outcome) = outcome {
                    let view = keys.entry(key).or_default();
                    if outcome == "unknown" {
                        view.first_unknown.get_or_insert(*at);
                    }
                    view.answers
                        .push((outcome, reference.as_deref(), *safe_to_repeat));
                }
            }
            Entry::Arrival { key, .. } => {
                report.arrivals += 1;
                keys.entry(key).or_default().arrivals += 1;
            }
            Entry::Effect { key, reference, .. } => {
                report.effects += 1;
                keys.entry(key).or_default().effects.push(reference);
            }
            Entry::Nemesis { at, .. } => {
                report.nemesis += 1;
                disruptions.push(*at);
            }
            Entry::Final {
                at,
                key,
                outcome,
                reference,
                error,
                ..
            } => {
                any_final = true;
                let view = keys.entry(key).or_default();
                if outcome.as_deref() == Some("unknown") {
                    view.first_unknown.get_or_insert(*at);
                }
                view.finals
                    .push((outcome.as_deref(), reference.as_deref(), error.as_deref()));
            }
        }
    }
    report.keys = keys.values().filter(|k| k.invoked).count();

    let mut found = |check: Check, key: &str, detail: String| {
        report.violations.push(Violation {
            check,
            key: key.to_string(),
            detail,
        })
    };
    for (key, view) in &keys {
        if view.effects.len() > 1 {
            found(
                Check::DuplicateEffect,
                key,
                format!(
                    "{} effects: {}",
                    view.effects.len(),
                    view.effects.join(", ")
                ),
            );
        }
        let successes = view
            .answers
            .iter()
            .map(|(o, r, _)| (*o, *r, "answer"))
            .chain(
                view.finals
                    .iter()
                    .filter_map(|(o, r, _)| o.map(|o| (o, *r, "final read"))),
            )
            .filter(|(o, _, _)| is_success(o));
        for (outcome, reference, source) in successes {
            match reference {
                Some(r) if view.effects.contains(&r) => {}
                Some(r) if view.effects.is_empty() => found(
                    Check::WrongReference,
                    key,
                    format!("{source} {outcome} names {r}, but the downstream performed no effect"),
                ),
                Some(r) => found(
                    Check::WrongReference,
                    key,
                    format!(
                        "{source} {outcome} names {r}, the downstream's effect is {}",
                        view.effects.join(", ")
                    ),
                ),
                None => found(
                    Check::WrongReference,
                    key,
                    format!("{source} {outcome} names no reference"),
                ),
            }
        }
        if !view.effects.is_empty() {
            let unsafe_answers = view
                .answers
                .iter()
                .filter(|(_, _, safe)| *safe == Some(true))
                .count();
            if unsafe_answers > 0 {
                found(
                    Check::UnsafeRepeat,
                    key,
                    format!(
                        "{unsafe_answers} answer(s) said safe_to_repeat, the downstream has effect {}",
                        view.effects.join(", ")
                    ),
                );
            }
        }
        // A process or the database died while the key was being delivered: for a tool
        // that does not deduplicate, its "sending" mark may have no request behind it.
        let disrupted = match (view.first_invoke, view.first_unknown) {
            (Some(from), Some(to)) => disruptions.iter().any(|t| *t >= from && *t <= to),
            _ => true,
        };
        let provable = !view.tool.is_some_and(|t| non_dedup.contains(t)) || !disrupted;
        if view.arrivals == 0 && provable {
            let unknowns = view
                .answers
                .iter()
                .filter(|(o, _, _)| *o == "unknown")
                .count()
                + view
                    .finals
                    .iter()
                    .filter(|(o, _, _)| *o == Some("unknown"))
                    .count();
            if unknowns > 0 {
                found(
                    Check::NeedlessUnknown,
                    key,
                    format!("unknown {unknowns} time(s), no request for it reached the downstream"),
                );
            }
        }
        if any_final && view.invoked {
            match view.finals.last() {
                None => found(Check::Unsettled, key, "never read after the run".into()),
                Some((Some("in_flight"), _, _)) => found(
                    Check::Unsettled,
                    key,
                    "still in flight after recovery".into(),
                ),
                Some((None, _, Some(error))) if *error != "no record" => {
                    found(Check::Unsettled, key, format!("could not be read: {error}"))
                }
                _ => {}
            }
            let gone = view
                .finals
                .last()
                .is_some_and(|(o, _, e)| o.is_none() && *e == Some("no record"));
            if gone && view.answers.iter().any(|(o, _, _)| is_success(o)) {
                found(
                    Check::RecordLost,
                    key,
                    "a caller heard applied/replayed; afterwards the key has no record".into(),
                );
            }
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: &str = "h:hist:w1:s";

    fn invoke(call: u64) -> Entry {
        Entry::Invoke {
            at: call,
            call,
            client: 0,
            face: "http".into(),
            gateway: 0,
            tool: "h.dedup".into(),
            key: K.into(),
        }
    }

    fn answer(call: u64, outcome: &str, reference: Option<&str>, safe: bool) -> Entry {
        Entry::Answer {
            at: call,
            call,
            key: K.into(),
            outcome: Some(outcome.into()),
            reference: reference.map(Into::into),
            safe_to_repeat: Some(safe),
            code: None,
            error: None,
        }
    }

    fn arrival() -> Entry {
        Entry::Arrival {
            at: 0,
            tool: "h.dedup".into(),
            key: K.into(),
            fault: "none".into(),
        }
    }

    fn effect(reference: &str) -> Entry {
        Entry::Effect {
            at: 0,
            tool: "h.dedup".into(),
            key: K.into(),
            reference: reference.into(),
        }
    }

    fn final_read(outcome: Option<&str>, reference: Option<&str>, error: Option<&str>) -> Entry {
        Entry::Final {
            at: 99,
            key: K.into(),
            outcome: outcome.map(Into::into),
            reference: reference.map(Into::into),
            error: error.map(Into::into),
        }
    }

    fn fired(entries: &[Entry]) -> Vec<Check> {
        check(entries).fired().into_iter().collect()
    }

    #[test]
    fn a_clean_history_passes() {
        let h = [
            invoke(1),
            arrival(),
            effect("r1"),
            answer(1, "applied", Some("r1"), false),
            invoke(2),
            answer(2, "replayed", Some("r1"), false),
            final_read(Some("replayed"), Some("r1"), None),
        ];
        let report = check(&h);
        assert!(report.ok(), "{report}");
        assert_eq!(report.keys, 1);
        assert_eq!(report.effects, 1);
    }

    #[test]
    fn two_effects_for_one_key_are_a_duplicate() {
        let h = [invoke(1), arrival(), effect("r1"), arrival(), effect("r2")];
        assert_eq!(fired(&h), [Check::DuplicateEffect]);
    }

    #[test]
    fn an_applied_answer_must_name_the_effect() {
        let wrong = [
            invoke(1),
            arrival(),
            effect("r1"),
            answer(1, "applied", Some("r9"), false),
        ];
        assert_eq!(fired(&wrong), [Check::WrongReference]);
        let none = [
            invoke(1),
            arrival(),
            answer(1, "replayed", Some("r1"), false),
        ];
        assert_eq!(fired(&none), [Check::WrongReference]);
        let missing = [
            invoke(1),
            arrival(),
            effect("r1"),
            answer(1, "applied", None, false),
        ];
        assert_eq!(fired(&missing), [Check::WrongReference]);
        let final_wrong = [
            invoke(1),
            arrival(),
            effect("r1"),
            final_read(Some("replayed"), Some("r2"), None),
        ];
        assert_eq!(fired(&final_wrong), [Check::WrongReference]);
    }

    #[test]
    fn safe_to_repeat_is_wrong_when_an_effect_exists_before_or_after() {
        let after = [
            invoke(1),
            arrival(),
            answer(1, "rejected", None, true),
            effect("r1"),
        ];
        assert_eq!(fired(&after), [Check::UnsafeRepeat]);
        let before = [
            invoke(1),
            arrival(),
            effect("r1"),
            answer(1, "rejected", None, true),
        ];
        assert_eq!(fired(&before), [Check::UnsafeRepeat]);
        let honest = [invoke(1), arrival(), answer(1, "rejected", None, true)];
        assert!(check(&honest).ok());
    }

    #[test]
    fn unknown_without_any_arrival_is_needless() {
        let h = [invoke(1), answer(1, "unknown", None, false)];
        assert_eq!(fired(&h), [Check::NeedlessUnknown]);
        let reached = [invoke(1), arrival(), answer(1, "unknown", None, false)];
        assert!(check(&reached).ok());
        let final_unknown = [invoke(1), final_read(Some("unknown"), None, None)];
        assert_eq!(fired(&final_unknown), [Check::NeedlessUnknown]);
    }

    #[test]
    fn unknown_without_arrival_is_excused_only_for_a_tool_without_dedup_that_lost_a_process() {
        let meta = Entry::Meta {
            seed: 1,
            settings: serde_json::json!({NON_DEDUPLICATING: ["h.dedup"]}),
        };
        let kill = |at| Entry::Nemesis {
            at,
            what: "SIGKILL gateway 0".into(),
        };
        // invoke at 1, unknown answered at 1: a kill at 1 lies inside the delivery.
        let excused = [
            meta.clone(),
            invoke(1),
            kill(1),
            answer(1, "unknown", None, false),
        ];
        assert!(check(&excused).ok());
        let no_kill = [meta.clone(), invoke(1), answer(1, "unknown", None, false)];
        assert_eq!(fired(&no_kill), [Check::NeedlessUnknown]);
        let kill_after = [meta, invoke(1), answer(1, "unknown", None, false), kill(50)];
        assert_eq!(fired(&kill_after), [Check::NeedlessUnknown]);
        // Without the meta entry's list every tool deduplicates: no excuse.
        let dedup = [invoke(1), kill(1), answer(1, "unknown", None, false)];
        assert_eq!(fired(&dedup), [Check::NeedlessUnknown]);
    }

    #[test]
    fn after_the_run_every_key_settles_and_no_receipt_is_gone() {
        let in_flight = [
            invoke(1),
            arrival(),
            final_read(Some("in_flight"), None, None),
        ];
        assert_eq!(fired(&in_flight), [Check::Unsettled]);
        let unread = [
            invoke(1),
            arrival(),
            Entry::Final {
                at: 1,
                key: "h:hist:other:s".into(),
                outcome: Some("rejected".into()),
                reference: None,
                error: None,
            },
        ];
        assert_eq!(fired(&unread), [Check::Unsettled]);
        let gone = [
            invoke(1),
            arrival(),
            effect("r1"),
            answer(1, "applied", Some("r1"), false),
            final_read(None, None, Some("no record")),
        ];
        assert_eq!(fired(&gone), [Check::RecordLost]);
        // A key that never had an effect may be gone (a refusal swept, a claim released).
        let never = [invoke(1), final_read(None, None, Some("no record"))];
        assert!(check(&never).ok());
    }

    #[test]
    fn a_history_survives_its_file_format() {
        let h = vec![
            Entry::Meta {
                seed: 7,
                settings: serde_json::json!({"clients": 2}),
            },
            invoke(1),
            arrival(),
            effect("r1"),
            answer(1, "applied", Some("r1"), false),
            Entry::Nemesis {
                at: 3,
                what: "kill gateway 0".into(),
            },
            final_read(Some("replayed"), Some("r1"), None),
        ];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.jsonl");
        crate::history::write(&path, &h).unwrap();
        assert_eq!(crate::history::read(&path).unwrap(), h);
        std::fs::write(&path, "{\"kind\":\"nonsense\"}\n").unwrap();
        let err = crate::history::read(&path).unwrap_err().to_string();
        assert!(err.contains(":1: not a history entry"), "{err}");
    }
}
