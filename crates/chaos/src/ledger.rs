//! The proxy's ledger: every request, per `Idempotency-Key`, with what the upstream answered
//! and what the caller was told, and the summary that names duplicate effects.
//!
//! A *commit* is an upstream answer that shows an effect: a 2xx answer, to a method that can
//! have one (not GET, HEAD or OPTIONS), carrying a reference at the configured JSON pointer.
//! A key whose commits name more than one reference reached the upstream's commit twice: a
//! duplicate effect. A deduplicating upstream answers a repeated key with the first reference,
//! so repeats of one effect are not duplicates.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use serde::Serialize;

/// What one forwarded copy of a request got from the upstream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Upstream {
    /// The upstream's status; `None` when no answer came (see `error`).
    pub status: Option<u16>,
    /// Why no answer came: the upstream unreachable, a timeout, a broken connection.
    pub error: Option<String>,
    /// The reference in a 2xx answer, at the configured pointer.
    pub reference: Option<String>,
    /// The job id in a `202` answer, where a job pointer is configured.
    pub job: Option<String>,
    /// Whether this answer shows an effect (see the module's documentation).
    pub commit: bool,
}

/// What the proxy told the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Told {
    /// An answer with this status: the upstream's, or one the proxy made (an injected error,
    /// a 502 for an unreachable upstream, a 413 for a body too large).
    Status(u16),
    /// `200` with a body that is not JSON.
    Malformed,
    /// The connection closed without an answer.
    Dropped,
    /// The connection was reset.
    Reset,
}

impl Told {
    fn label(self) -> String {
        match self {
            Told::Status(status) => status.to_string(),
            Told::Malformed => "malformed".into(),
            Told::Dropped => "dropped".into(),
            Told::Reset => "reset".into(),
        }
    }
}

/// One request through the proxy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Entry {
    /// Arrival order, from 1.
    pub seq: u64,
    pub key: Option<String>,
    /// The request's number among its key's requests (or among key-less ones), from 1.
    pub nth: u64,
    pub method: String,
    /// Path and query, as the caller sent them.
    pub path: String,
    /// The fault applied (`pass`, `drop`, `error=502`, …).
    pub fault: String,
    /// Each copy forwarded, in order: none after a reset, two for a duplicate.
    pub upstream: Vec<Upstream>,
    pub told: Told,
    /// Milliseconds from the proxy's start to the request's arrival.
    pub at_ms: u64,
    /// Milliseconds the request took, forwarding included.
    pub millis: u64,
}

/// Everything the ledger knows about one key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct KeySummary {
    pub key: String,
    pub requests: u64,
    /// Copies that reached the upstream (a duplicate counts two).
    pub forwarded: u64,
    /// Upstream answers that show an effect.
    pub commits: u64,
    /// The distinct references of those commits, in the order first seen.
    pub references: Vec<String>,
    /// The distinct job ids the upstream accepted for the key, in the order first seen.
    pub jobs: Vec<String>,
    /// What the caller was told, by label (`201`, `dropped`, …), and how often.
    pub told: BTreeMap<String, u64>,
    /// The faults applied, by name, and how often.
    pub faults: BTreeMap<String, u64>,
}

impl KeySummary {
    /// The key reached the upstream's commit with more than one reference, or had more
    /// than one job accepted.
    pub fn duplicate(&self) -> bool {
        self.references.len() > 1 || self.jobs.len() > 1
    }
}

/// The ledger as a whole.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub requests: u64,
    pub forwarded: u64,
    pub commits: u64,
    /// Distinct keys seen.
    pub keys: u64,
    /// Requests without the key header.
    pub keyless: u64,
    pub faults: BTreeMap<String, u64>,
    /// Every key with a duplicate effect.
    pub duplicates: Vec<KeySummary>,
    /// Entries left out of the ledger once it held its maximum (their keys are still counted).
    pub unrecorded: u64,
}

impl Summary {
    /// Whether any key had a duplicate effect.
    pub fn has_duplicates(&self) -> bool {
        !self.duplicates.is_empty()
    }

    /// The summary for people: totals, faults, and each duplicate with its references.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} requests ({} keys, {} without a key): {} copies forwarded, {} commits",
            self.requests, self.keys, self.keyless, self.forwarded, self.commits
        );
        if !self.faults.is_empty() {
            let faults: Vec<String> = self
                .faults
                .iter()
                .map(|(f, n)| format!("{f} {n}"))
                .collect();
            let _ = writeln!(out, "faults: {}", faults.join(", "));
        }
        if self.unrecorded > 0 {
            let _ = writeln!(
                out,
                "{} requests were counted but not kept in the ledger (it was full)",
                self.unrecorded
            );
        }
        if self.duplicates.is_empty() {
            let _ = writeln!(
                out,
                "no duplicate effects: no key committed twice with different references"
            );
        } else {
            let _ = writeln!(
                out,
                "DUPLICATE EFFECTS: {} keys reached the upstream's commit with different references",
                self.duplicates.len()
            );
            for key in &self.duplicates {
                let told: Vec<String> = key.told.iter().map(|(t, n)| format!("{t}×{n}")).collect();
                let mut named = key.references.clone();
                named.extend(key.jobs.iter().map(|j| format!("job {j}")));
                let _ = writeln!(
                    out,
                    "  {}: references {}; {} requests, {} forwarded, told {}",
                    key.key,
                    named.join(", "),
                    key.requests,
                    key.forwarded,
                    told.join(", ")
                );
            }
        }
        out
    }
}

/// The ledger of one proxy. Cheap to share behind the proxy's `Arc`.
#[derive(Debug)]
pub struct Ledger {
    started: Instant,
    max_entries: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    seq: u64,
    keyless: u64,
    entries: Vec<Entry>,
    unrecorded: u64,
    keys: HashMap<String, KeySummary>,
    /// Keys in the order first seen, so listings are stable.
    order: Vec<String>,
}

/// A ticket for one request, handed out on arrival and given back with its entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    pub seq: u64,
    pub nth: u64,
    pub at_ms: u64,
}

impl Ledger {
    /// A ledger keeping at most `max_entries` entries; past that, requests are still counted
    /// per key but their entries are not kept, so a long run's memory stays bounded by keys.
    pub fn new(max_entries: usize) -> Ledger {
        Ledger {
            started: Instant::now(),
            max_entries,
            inner: Mutex::default(),
        }
    }

    // A std mutex: held only to update counters and push an entry, never across an await.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Numbers a request as it arrives: its place overall and among its key's requests.
    pub fn arrive(&self, key: Option<&str>) -> Arrival {
        let at_ms = self.started.elapsed().as_millis() as u64;
        let mut inner = self.lock();
        inner.seq += 1;
        let seq = inner.seq;
        let nth = match key {
            None => {
                inner.keyless += 1;
                inner.keyless
            }
            Some(key) => {
                if !inner.keys.contains_key(key) {
                    inner.order.push(key.to_string());
                    inner.keys.insert(
                        key.to_string(),
                        KeySummary {
                            key: key.to_string(),
                            ..KeySummary::default()
                        },
                    );
                }
                let summary = inner.keys.get_mut(key).expect("inserted above");
                summary.requests += 1;
                summary.requests
            }
        };
        Arrival { seq, nth, at_ms }
    }

    /// How many requests have arrived so far: every later request's `seq` is greater.
    pub fn arrived(&self) -> u64 {
        self.lock().seq
    }

    /// Milliseconds since the ledger started.
    pub fn elapsed_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Records a finished request.
    pub fn record(&self, entry: Entry) {
        let mut inner = self.lock();
        if let Some(key) = &entry.key
            && let Some(summary) = inner.keys.get_mut(key)
        {
            summary.forwarded += entry.upstream.len() as u64;
            for copy in entry.upstream.iter().filter(|u| u.commit) {
                summary.commits += 1;
                if let Some(reference) = &copy.reference
                    && !summary.references.contains(reference)
                {
                    summary.references.push(reference.clone());
                }
            }
            for job in entry.upstream.iter().filter_map(|u| u.job.as_ref()) {
                if !summary.jobs.contains(job) {
                    summary.jobs.push(job.clone());
                }
            }
            *summary.told.entry(entry.told.label()).or_default() += 1;
            *summary.faults.entry(fault_name(&entry.fault)).or_default() += 1;
        }
        if inner.entries.len() < self.max_entries {
            inner.entries.push(entry);
        } else {
            inner.unrecorded += 1;
        }
    }

    /// Every kept entry, in the order requests finished.
    pub fn entries(&self) -> Vec<Entry> {
        let mut entries = self.lock().entries.clone();
        entries.sort_by_key(|e| e.seq);
        entries
    }

    /// The kept entries of one key, in arrival order.
    pub fn entries_for(&self, key: &str) -> Vec<Entry> {
        let mut entries: Vec<Entry> = self
            .lock()
            .entries
            .iter()
            .filter(|e| e.key.as_deref() == Some(key))
            .cloned()
            .collect();
        entries.sort_by_key(|e| e.seq);
        entries
    }

    /// One key's summary.
    pub fn key(&self, key: &str) -> Option<KeySummary> {
        self.lock().keys.get(key).cloned()
    }

    /// Every key's summary, in the order keys were first seen.
    pub fn keys(&self) -> Vec<KeySummary> {
        let inner = self.lock();
        inner
            .order
            .iter()
            .filter_map(|k| inner.keys.get(k).cloned())
            .collect()
    }

    /// The totals and the duplicates.
    pub fn summary(&self) -> Summary {
        let inner = self.lock();
        let mut summary = Summary {
            requests: inner.seq,
            keys: inner.keys.len() as u64,
            keyless: inner.keyless,
            unrecorded: inner.unrecorded,
            ..Summary::default()
        };
        for key in inner.order.iter().filter_map(|k| inner.keys.get(k)) {
            summary.forwarded += key.forwarded;
            summary.commits += key.commits;
            for (fault, n) in &key.faults {
                *summary.faults.entry(fault.clone()).or_default() += n;
            }
            if key.duplicate() {
                summary.duplicates.push(key.clone());
            }
        }
        // Key-less requests count in the totals; they can have no duplicate by key.
        for entry in inner.entries.iter().filter(|e| e.key.is_none()) {
            summary.forwarded += entry.upstream.len() as u64;
            summary.commits += entry.upstream.iter().filter(|u| u.commit).count() as u64;
            *summary.faults.entry(fault_name(&entry.fault)).or_default() += 1;
        }
        summary.faults.remove("pass");
        summary
    }
}

/// `error=502` counts as `error`, `delay=2000ms` as `delay`.
fn fault_name(fault: &str) -> String {
    fault.split('=').next().unwrap_or(fault).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(
        arrival: Arrival,
        key: &str,
        fault: &str,
        answers: &[(u16, Option<&str>)],
        told: Told,
    ) -> Entry {
        Entry {
            seq: arrival.seq,
            key: Some(key.into()),
            nth: arrival.nth,
            method: "POST".into(),
            path: "/tickets".into(),
            fault: fault.into(),
            upstream: answers
                .iter()
                .map(|(status, reference)| Upstream {
                    status: Some(*status),
                    error: None,
                    reference: reference.map(str::to_string),
                    job: None,
                    commit: (200..300).contains(status) && reference.is_some(),
                })
                .collect(),
            told,
            at_ms: 0,
            millis: 1,
        }
    }

    #[test]
    fn a_key_committed_twice_with_different_references_is_a_duplicate() {
        let ledger = Ledger::new(10);
        let a = ledger.arrive(Some("a"));
        ledger.record(entry(a, "a", "drop", &[(201, Some("t1"))], Told::Dropped));
        let a2 = ledger.arrive(Some("a"));
        assert_eq!(a2.nth, 2);
        // A deduplicating upstream: the same reference again.
        ledger.record(entry(
            a2,
            "a",
            "pass",
            &[(200, Some("t1"))],
            Told::Status(200),
        ));
        let b = ledger.arrive(Some("b"));
        ledger.record(entry(
            b,
            "b",
            "duplicate",
            &[(201, Some("t2")), (201, Some("t3"))],
            Told::Status(201),
        ));
        let c = ledger.arrive(Some("c"));
        ledger.record(entry(c, "c", "reset", &[], Told::Reset));
        let summary = ledger.summary();
        assert_eq!(summary.requests, 4);
        assert_eq!(summary.commits, 4);
        assert_eq!(summary.forwarded, 4);
        assert_eq!(summary.keys, 3);
        assert_eq!(summary.duplicates.len(), 1);
        assert_eq!(summary.duplicates[0].key, "b");
        assert_eq!(summary.duplicates[0].references, vec!["t2", "t3"]);
        assert_eq!(summary.faults.get("duplicate"), Some(&1));
        assert_eq!(summary.faults.get("pass"), None);
        let a = ledger.key("a").unwrap();
        assert!(!a.duplicate());
        assert_eq!(a.told.get("dropped"), Some(&1));
        assert!(summary.render().contains("b: references t2, t3"));
        assert_eq!(ledger.entries_for("a").len(), 2);
    }

    #[test]
    fn a_full_ledger_still_counts_keys() {
        let ledger = Ledger::new(1);
        for _ in 0..3 {
            let a = ledger.arrive(Some("a"));
            ledger.record(entry(
                a,
                "a",
                "pass",
                &[(201, Some("t1"))],
                Told::Status(201),
            ));
        }
        assert_eq!(ledger.entries().len(), 1);
        assert_eq!(ledger.key("a").unwrap().commits, 3);
        assert_eq!(ledger.summary().unrecorded, 2);
    }
}
