//! Settled records kept in memory, so that a replay reads no row.
//!
//! An `applied` or `failed_permanent` record cannot change until it expires: no transition
//! leaves either state except the sweep's compaction to a tombstone, and the sweep only takes
//! records whose `expires_at` has passed. Until then, whichever process or store holds the
//! record, reading it again can only return what was read before. So the executor keeps the
//! settled records it has seen (claimed and finished itself, or read) and answers a replay from
//! here while the record has more than [`MARGIN`] left to live; after that it reads the store
//! again, where the retention policy of a late delivery takes over.
//!
//! The memory is bounded by a count of records: two generations of at most `capacity / 2`
//! entries each, the older dropped whole when the newer fills. A record read in the older
//! generation moves to the newer, so what is replayed often stays. A record whose result is
//! larger than [`MAX_RESULT_BYTES`] is not kept (its replays read the store), so the memory is
//! at most about `capacity` × 8 KiB.

use std::collections::HashMap;
use std::sync::Mutex;

use idemgate_core::key::OperationKey;
use idemgate_core::record::{Millis, Record, RecordState, RecordStatus};

/// How long before its expiry a record stops being answered from memory: room for the clocks of
/// other processes sharing the store (whose sweeper may compact it by their clock) to run ahead
/// of this one.
pub const MARGIN: Millis = 60_000;

/// The largest result (as JSON) a kept record may carry.
pub const MAX_RESULT_BYTES: usize = 8 * 1024;

/// Counts the bytes written to it, and stops the writer once past the limit.
struct Budget(usize);

impl std::io::Write for Budget {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        if self.0 > MAX_RESULT_BYTES {
            return Err(std::io::Error::other("over the budget"));
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Whether what `record` would keep in memory is small enough.
fn small(record: &Record) -> bool {
    match &record.state {
        RecordState::Applied(receipt) => {
            receipt.reference.len() <= MAX_RESULT_BYTES
                && serde_json::to_writer(Budget(receipt.reference.len()), &receipt.result).is_ok()
        }
        RecordState::FailedPermanent(refusal) => refusal.message.len() <= MAX_RESULT_BYTES,
        RecordState::Pending { .. }
        | RecordState::AwaitingApproval { .. }
        | RecordState::Unknown(_)
        | RecordState::Tombstone(_) => false,
    }
}

pub(crate) struct Settled {
    half: usize,
    generations: Mutex<Generations>,
}

#[derive(Default)]
struct Generations {
    newer: HashMap<String, Record>,
    older: HashMap<String, Record>,
}

impl Settled {
    /// Keeps at most `capacity` records; 0 keeps none.
    pub(crate) fn new(capacity: usize) -> Settled {
        Settled {
            half: capacity / 2,
            generations: Mutex::new(Generations::default()),
        }
    }

    /// Whether `record` may be kept and answered from memory at `now`.
    fn keepable(record: &Record, now: Millis) -> bool {
        matches!(
            record.status(),
            RecordStatus::Applied | RecordStatus::FailedPermanent
        ) && now < record.expires_at.saturating_sub(MARGIN)
    }

    /// The settled record of `key`, if it is kept and still has time to live at `now`.
    pub(crate) fn get(&self, key: &OperationKey, now: Millis) -> Option<Record> {
        if self.half == 0 {
            return None;
        }
        let mut g = self.generations.lock().unwrap_or_else(|e| e.into_inner());
        let found = match g.newer.get(key.as_str()) {
            Some(record) => Some(record.clone()),
            None => {
                let record = g.older.remove(key.as_str())?;
                let copy = record.clone();
                g.insert(self.half, key.as_str().to_owned(), record);
                Some(copy)
            }
        };
        match found {
            Some(record) if Settled::keepable(&record, now) => Some(record),
            Some(_) => {
                g.newer.remove(key.as_str());
                None
            }
            None => None,
        }
    }

    /// Keeps `record` if it is settled and has time to live at `now`.
    pub(crate) fn offer(&self, record: &Record, now: Millis) {
        if self.half == 0 || !Settled::keepable(record, now) || !small(record) {
            return;
        }
        let mut g = self.generations.lock().unwrap_or_else(|e| e.into_inner());
        if !g.newer.contains_key(record.key.as_str()) {
            g.insert(self.half, record.key.as_str().to_owned(), record.clone());
        }
    }
}

impl Generations {
    fn insert(&mut self, half: usize, key: String, record: Record) {
        if self.newer.len() >= half {
            // The older generation goes; its table, already sized for a whole generation,
            // becomes the newer one. A fresh table would grow by doubling and move every
            // record it holds at each step, on the unique-key path.
            std::mem::swap(&mut self.newer, &mut self.older);
            self.newer.clear();
        }
        self.newer.insert(key, record);
    }
}

#[cfg(test)]
mod tests {
    use idemgate_core::fingerprint::Fingerprint;
    use idemgate_core::key::OperationKey;
    use idemgate_core::record::{Evidence, Receipt, Record, RecordState};
    use serde_json::json;

    use super::{MARGIN, Settled};

    fn record(step: &str, state: RecordState, expires_at: i64) -> Record {
        let key = OperationKey::new("acme", "prod", "wf", step).expect("a valid key");
        Record {
            key,
            tool: "tickets.create".into(),
            tool_version: "1".into(),
            fingerprint: Fingerprint::parse(&format!("sha256:{}", "a".repeat(64)))
                .expect("a valid fingerprint"),
            canonicalization: 1,
            state,
            fence: 1,
            actor: "agent".into(),
            request: None,
            approved_by: None,
            created_at: 0,
            updated_at: 0,
            expires_at,
            purge_at: expires_at + 1,
            intent_window: false,
        }
    }

    fn applied(step: &str, expires_at: i64) -> Record {
        record(
            step,
            RecordState::Applied(Receipt {
                reference: format!("T-{step}"),
                result: json!({"ok": true}),
            }),
            expires_at,
        )
    }

    #[test]
    fn keeps_settled_records_until_the_margin_before_expiry() {
        let settled = Settled::new(8);
        let r = applied("a", 1_000_000);
        settled.offer(&r, 0);
        assert_eq!(settled.get(&r.key, 0), Some(r.clone()));
        assert_eq!(settled.get(&r.key, 1_000_000 - MARGIN - 1), Some(r.clone()));
        assert_eq!(settled.get(&r.key, 1_000_000 - MARGIN), None);
        // Dropped once stale: a later, earlier-dated read does not bring it back.
        assert_eq!(settled.get(&r.key, 0), None);
    }

    #[test]
    fn keeps_nothing_that_can_still_change() {
        let settled = Settled::new(8);
        for state in [
            RecordState::AwaitingApproval { until: 0 },
            RecordState::Unknown(Evidence {
                reason: "timed out".into(),
                reference: None,
                job_id: None,
            }),
        ] {
            let r = record("b", state, 1_000_000);
            settled.offer(&r, 0);
            assert_eq!(settled.get(&r.key, 0), None);
        }
        let near_expiry = applied("c", MARGIN);
        settled.offer(&near_expiry, 0);
        assert_eq!(settled.get(&near_expiry.key, 0), None);
    }

    #[test]
    fn holds_at_most_its_capacity_and_keeps_what_is_read() {
        let settled = Settled::new(4);
        let records: Vec<Record> = (0..6)
            .map(|i| applied(&format!("s{i}"), 1_000_000))
            .collect();
        for r in &records[..4] {
            settled.offer(r, 0);
        }
        // s0 and s1 were pushed to the older generation by s2; reading s0 keeps it.
        assert!(settled.get(&records[0].key, 0).is_some());
        for r in &records[4..] {
            settled.offer(r, 0);
        }
        let kept: Vec<bool> = records
            .iter()
            .map(|r| settled.get(&r.key, 0).is_some())
            .collect();
        assert!(kept.iter().filter(|k| **k).count() <= 4, "{kept:?}");
        assert!(kept[5], "the newest is kept: {kept:?}");
    }

    #[test]
    fn a_large_result_is_not_kept() {
        let settled = Settled::new(8);
        let mut big = applied("e", 1_000_000);
        if let RecordState::Applied(receipt) = &mut big.state {
            receipt.result = json!({ "body": "x".repeat(super::MAX_RESULT_BYTES) });
        }
        settled.offer(&big, 0);
        assert_eq!(settled.get(&big.key, 0), None);
    }

    #[test]
    fn capacity_zero_keeps_none() {
        let settled = Settled::new(0);
        let r = applied("d", 1_000_000);
        settled.offer(&r, 0);
        assert_eq!(settled.get(&r.key, 0), None);
    }
}
