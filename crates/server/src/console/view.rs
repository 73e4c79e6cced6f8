//! How the console writes times, keys in links, and evidence.

use idemgate_core::record::{Event, EventKind, Millis, Record, RecordState};

/// Who is signed in, for the page header.
#[derive(Debug, Clone)]
pub struct Who {
    pub tenant: String,
    pub name: String,
    pub environment: String,
}

/// A time as the console shows it: an age ("3 min ago") with the UTC time on hover.
#[derive(Debug, Clone)]
pub struct When {
    pub age: String,
    pub utc: String,
}

impl When {
    pub fn of(at: Millis, now: Millis) -> When {
        When {
            age: age(at, now),
            utc: utc(at),
        }
    }
}

/// "just now", "42 s ago", "3 min ago", "5 h ago", "2 days ago"; "in 4 min" for a future time.
pub fn age(at: Millis, now: Millis) -> String {
    let (seconds, future) = if at > now {
        ((at - now) / 1000, true)
    } else {
        ((now - at) / 1000, false)
    };
    let span = match seconds {
        0..=4 => return "just now".into(),
        5..=59 => format!("{seconds} s"),
        60..=3599 => format!("{} min", seconds / 60),
        3600..=86_399 => format!("{} h", seconds / 3600),
        _ => match seconds / 86_400 {
            1 => "1 day".into(),
            n => format!("{n} days"),
        },
    };
    if future {
        format!("in {span}")
    } else {
        format!("{span} ago")
    }
}

/// `2026-12-01 16:11:31 UTC` (milliseconds since the epoch, proleptic Gregorian calendar):
/// API v1's RFC 3339 time, to the second.
pub fn utc(at: Millis) -> String {
    let exact = rfc3339(at);
    match exact.split_once('T') {
        Some((date, time)) => format!("{date} {} UTC", time.get(..8).unwrap_or(time)),
        None => exact,
    }
}

pub use idemgate_app::views::rfc3339;

/// An operation key as one path segment: every byte but the unreserved ones percent-encoded
/// (key parts may hold `/`, `?`, `#`, `%` or spaces).
pub fn key_path(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b':') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The link to an operation's page.
pub fn operation_href(key: &str) -> String {
    format!("/console/operations/{}", key_path(key))
}

/// Events that say what recovery tried and what it found.
fn is_recovery(kind: EventKind) -> bool {
    matches!(
        kind,
        EventKind::Recovered
            | EventKind::Unknown
            | EventKind::Released
            | EventKind::Failed
            | EventKind::Reconciled
            | EventKind::Expired
    )
}

/// What recovery tried and what it answered: the record's own evidence first (why it is
/// `unknown`, a reference or job the downstream gave), then the recovery events, oldest first.
pub fn evidence(record: &Record, events: &[Event]) -> Vec<String> {
    let mut lines = Vec::new();
    match &record.state {
        RecordState::Unknown(e) => {
            lines.push(e.reason.clone());
            if let Some(reference) = &e.reference {
                lines.push(format!("the downstream named reference {reference}"));
            }
            if let Some(job) = &e.job_id {
                lines.push(format!("job {job}"));
            }
        }
        RecordState::Pending { lease, dispatch } => {
            let owner = lease.owner.as_deref().unwrap_or("nobody (released)");
            lines.push(format!("held by {owner}; dispatch {}", dispatch.tag()));
        }
        RecordState::AwaitingApproval { until } => {
            lines.push(format!("approval window ends {}", utc(*until)));
        }
        RecordState::Applied(_) | RecordState::FailedPermanent(_) | RecordState::Tombstone(_) => {}
    }
    let reason = match &record.state {
        RecordState::Unknown(e) => Some(e.reason.as_str()),
        _ => None,
    };
    for e in events.iter().filter(|e| is_recovery(e.kind)) {
        // The event that recorded the reason above says when and who, not the reason again.
        let detail = match e.detail.as_deref() {
            Some(d) if Some(d) == reason => "",
            Some(d) => d,
            None => "",
        };
        lines.push(
            format!(
                "{} (attempt {}, {}) {detail}",
                e.kind.as_str(),
                e.attempt,
                e.worker
            )
            .trim_end()
            .to_string(),
        );
    }
    lines
}

/// A JSON value for a `<pre>`: indented; askama escapes it.
pub fn pretty(value: &serde_json::Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_795_827_723_042), "2026-11-28 01:02:03 UTC");
        assert_eq!(utc(-1), "1969-12-31 23:59:59 UTC");
    }

    #[test]
    fn ages() {
        assert_eq!(age(1_000, 2_000), "just now");
        assert_eq!(age(0, 42_000), "42 s ago");
        assert_eq!(age(0, 180_000), "3 min ago");
        assert_eq!(age(0, 5 * 3_600_000), "5 h ago");
        assert_eq!(age(0, 2 * 86_400_000), "2 days ago");
        assert_eq!(age(300_000, 0), "in 5 min");
    }

    #[test]
    fn keys_in_paths() {
        assert_eq!(key_path("acme:prod:wf-1:s1"), "acme:prod:wf-1:s1");
        assert_eq!(key_path("a:b:x/y?z#%:s 1"), "a:b:x%2Fy%3Fz%23%25:s%201");
    }
}
