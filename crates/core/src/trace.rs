//! The stored form of an operation's trace, shared by the stores that keep it in the
//! operation's own row (SQLite since its migration 0004, PostgreSQL since its migration 0007):
//! a `trace` text column holding one JSON array per entry, each ended by a newline, oldest
//! first. A write appends with `trace = trace || ?`, so the entries already there are never
//! rewritten by our code, only carried along when the database rewrites the row.
//!
//! Why in the row and not in a table of its own: every transition already rewrites its row,
//! while a table of entries cost the writer thread two more b-tree inserts per entry (the
//! table and its index by key), a statement journal for each multi-row insert, and the
//! counter of `AUTOINCREMENT` — measured at some 44 % of the writer's instructions, the
//! largest single cost of an operation. The trace goes with its row: a purge deletes both, and
//! a key claimed again after its purge starts a trace of its own.
//!
//! An entry is `[kind, at, attempt, worker, detail]` (`detail` may be `null`): JSON, so that its
//! escaping keeps it on one line whatever `detail` holds, and an array rather than an object,
//! because the trace is most of the row's bytes — `Event`'s object form made a settled row
//! ~850 bytes, some four rows to a page, where arrays make it ~650; fewer pages per commit is
//! fewer write-ahead-log frames (measured: a quarter fewer page writes and reads at 64 callers).

use std::fmt::Write;

use crate::key::OperationKey;
use crate::record::{Event, EventKind, Millis};
use crate::store::Error;

/// The text `events` adds to a trace. Built by the caller's task, not by the writer thread,
/// and by hand: every claim and transition encodes its entries, and serde's derived serializer
/// took several times the instructions for the same bytes (a test holds the two equal).
pub fn encode(events: &[Event]) -> String {
    let mut text = String::with_capacity(events.len() * 64);
    for event in events {
        text.push_str("[\"");
        text.push_str(event.kind.as_str());
        text.push_str("\",");
        integer(&mut text, event.at.unsigned_abs(), event.at < 0);
        text.push(',');
        integer(&mut text, event.attempt, false);
        text.push(',');
        string(&mut text, &event.worker);
        text.push(',');
        match &event.detail {
            Some(detail) => string(&mut text, detail),
            None => text.push_str("null"),
        }
        text.push_str("]\n");
    }
    text
}

/// A decimal integer, without the formatting machinery.
fn integer(text: &mut String, magnitude: u64, negative: bool) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = magnitude;
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if negative {
        text.push('-');
    }
    // Only ASCII digits were written.
    text.push_str(std::str::from_utf8(&digits[at..]).unwrap_or_default());
}

/// `value` as a JSON string, escaped as `serde_json` escapes it: quotes, backslashes and control
/// characters, so that no entry spans two lines.
fn string(text: &mut String, value: &str) {
    text.push('"');
    // Names and details rarely hold anything to escape: one pass to find out, then one copy.
    if !value.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        text.push_str(value);
        text.push('"');
        return;
    }
    let mut plain = 0;
    for (i, byte) in value.bytes().enumerate() {
        let escape = match byte {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0x00..=0x1f => "",
            _ => continue,
        };
        text.push_str(&value[plain..i]);
        plain = i + 1;
        if escape.is_empty() {
            let _ = write!(text, "\\u{byte:04x}");
        } else {
            text.push_str(escape);
        }
    }
    text.push_str(&value[plain..]);
    text.push('"');
}

/// The entries of a stored trace, oldest first. Whitespace between an entry's items is allowed
/// (PostgreSQL's `json_build_array(…)::text` writes a space after each comma).
pub fn decode(key: &OperationKey, text: &str) -> Result<Vec<Event>, Error> {
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str::<Entry>(line)
                .map(|(kind, at, attempt, worker, detail)| Event {
                    kind,
                    at,
                    attempt,
                    worker,
                    detail,
                })
                .map_err(|e| {
                    Error::Corrupt(format!(
                        "entry {} of the trace of {key} is not an event ({e}): {line}",
                        i + 1
                    ))
                })
        })
        .collect()
}

/// One stored entry: kind, at, attempt, worker, detail.
type Entry = (EventKind, Millis, u64, String, Option<String>);

#[cfg(test)]
mod tests {
    use crate::key::OperationKey;
    use crate::record::{Event, EventKind};

    use super::{decode, encode};

    fn key() -> OperationKey {
        OperationKey::parse("acme:prod:wf:step").expect("a valid key")
    }

    #[test]
    fn entries_round_trip_one_per_line() {
        let events = vec![
            Event::new(EventKind::Claimed, 1_000, 1, "w1"),
            Event::new(EventKind::Sent, 1_001, 1, "w1").with_detail("a\nb \"quoted\"\r\n"),
            Event::new(EventKind::Committed, i64::MAX, u64::MAX, ""),
        ];
        let text = encode(&events);
        assert_eq!(text.lines().count(), 3, "{text}");
        assert!(text.ends_with('\n'));
        assert_eq!(decode(&key(), &text).expect("decodes"), events);
        // Appending is concatenation.
        let more = encode(&[Event::new(EventKind::Acknowledged, 1_002, 1, "w1")]);
        let all = decode(&key(), &(text + &more)).expect("decodes");
        assert_eq!(all.len(), 4);
        assert_eq!(all[3].kind, EventKind::Acknowledged);
    }

    #[test]
    fn the_stored_form_is_fixed() {
        // What files already hold, and what migration 0004 writes with `json_array`: a change
        // of the encoder must not make them unreadable.
        let stored = "[\"claimed\",5,2,\"w\",null]\n[\"in_flight\",6,2,\"w\",\"x\"]\n";
        assert_eq!(
            decode(&key(), stored).expect("decodes"),
            vec![
                Event::new(EventKind::Claimed, 5, 2, "w"),
                Event::new(EventKind::InFlight, 6, 2, "w").with_detail("x"),
            ]
        );
        assert_eq!(encode(&decode(&key(), stored).expect("decodes")), stored);
        assert_eq!(decode(&key(), "").expect("empty"), vec![]);
    }

    #[test]
    fn postgresql_s_json_text_decodes() {
        // What PostgreSQL's migration 0007 and its sweep write with `json_build_array(…)::text`.
        let stored =
            "[\"claimed\", 5, 2, \"w\", null]\n[\"expired\", 9, 3, \"sweeper\", \"a\\nb\"]\n";
        assert_eq!(
            decode(&key(), stored).expect("decodes"),
            vec![
                Event::new(EventKind::Claimed, 5, 2, "w"),
                Event::new(EventKind::Expired, 9, 3, "sweeper").with_detail("a\nb"),
            ]
        );
    }

    #[test]
    fn the_encoding_is_serde_json_s_for_the_tuple() {
        let awkward = [
            "",
            "plain",
            "quote \" and backslash \\",
            "new\nline\r\ttab",
            "\u{0}\u{1}\u{8}\u{b}\u{c}\u{1f}\u{7f}",
            "unicode é ✓ 𝄞 / slash",
            "w-1",
            "gateway-7f3a",
        ];
        let numbers = [
            (-5, 7),
            (0, 0),
            (i64::MIN, u64::MAX),
            (i64::MAX, 10),
            (1_764_000_000_123, 1),
        ];
        for (i, text) in awkward.iter().enumerate() {
            let (at, attempt) = numbers[i % numbers.len()];
            let event = Event::new(EventKind::ALL[i % EventKind::ALL.len()], at, attempt, text)
                .with_detail(*text);
            for event in [
                event.clone(),
                Event {
                    detail: None,
                    ..event
                },
            ] {
                let tuple = (
                    event.kind,
                    event.at,
                    event.attempt,
                    &event.worker,
                    &event.detail,
                );
                let expected = serde_json::to_string(&tuple).expect("serialises") + "\n";
                assert_eq!(encode(std::slice::from_ref(&event)), expected);
            }
        }
    }

    #[test]
    fn a_damaged_entry_is_named() {
        let text =
            encode(&[Event::new(EventKind::Claimed, 1, 1, "w")]) + "[\"nope\",1,1,\"w\",null]\n";
        let err = decode(&key(), &text).expect_err("a damaged trace");
        let message = err.to_string();
        assert!(
            message.contains("entry 2") && message.contains("acme:prod:wf:step"),
            "{message}"
        );
    }
}
