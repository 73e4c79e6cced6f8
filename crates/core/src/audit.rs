//! The audit log: every operator action, hash-chained and signed, as data.
//!
//! The executor decides what an entry says ([`Draft`], carried by the transition it records in
//! [`Transition::audit`](crate::store::Transition::audit)); the store, inside the transaction
//! that applies the transition, reads the chain's [`Head`], seals the draft into an [`Entry`]
//! with [`Sealer::seal`] and writes both. So an entry exists exactly when its transition
//! committed, and the chain has one order even with many gateways on one database.
//!
//! The bytes hashed and signed are [`Entry::signed_bytes`]: a fixed domain tag, then every
//! field in a fixed order, integers as 8 big-endian bytes, texts as a 4-byte big-endian length
//! and their UTF-8, optional values behind a 0/1 byte, hashes and keys as their raw bytes. No
//! JSON is involved, so the encoding does not depend on a serialiser's choices. `hash` is the
//! SHA-256 of those bytes; `signature` is Ed25519 over the same bytes. Signing is a [`Signer`]
//! the store is given (the `idemgate-audit` crate implements it), so that this crate stays
//! free of the curve arithmetic.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::fingerprint::Fingerprint;
use crate::key::OperationKey;
use crate::record::{Millis, Record, RecordState, RecordStatus};
use crate::store::Transition;

/// The tag every entry's signed bytes start with; a new encoding gets a new tag.
pub const DOMAIN: &[u8] = b"idemgate-audit-v1\0";

/// The hash an entry with sequence number 1 points back to.
pub const GENESIS: [u8; 32] = [0; 32];

/// What an operator did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Approved,
    Denied,
    /// Resolved `applied` with a reference.
    ResolvedApplied,
    /// Resolved `not_applied`: the key may run again.
    ResolvedNotApplied,
    /// An operator's receipt lookup found the receipt and settled the record.
    SettledByLookup,
    /// Later evidence — a poll or a webhook event reporting the job's end, a receipt lookup
    /// that found it — settled an `unknown` record; the actor is `evidence`. Never a send.
    SettledByEvidence,
}

impl Action {
    pub const ALL: [Action; 6] = [
        Action::Approved,
        Action::Denied,
        Action::ResolvedApplied,
        Action::ResolvedNotApplied,
        Action::SettledByLookup,
        Action::SettledByEvidence,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Action::Approved => "approved",
            Action::Denied => "denied",
            Action::ResolvedApplied => "resolved_applied",
            Action::ResolvedNotApplied => "resolved_not_applied",
            Action::SettledByLookup => "settled_by_lookup",
            Action::SettledByEvidence => "settled_by_evidence",
        }
    }

    pub fn parse(text: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.as_str() == text)
    }
}

/// An entry as the executor decides it, before the store knows its place in the chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Draft {
    pub at: Millis,
    pub key: OperationKey,
    pub tool: String,
    pub action: Action,
    pub actor: String,
    pub reason: String,
    /// The request the action was about.
    pub fingerprint: Fingerprint,
    /// The record's status after the transition.
    pub status: RecordStatus,
    /// The effect's reference, when the transition settles the record as applied.
    pub reference: Option<String>,
}

impl Draft {
    /// The draft for `transition` made on `record` by an operator.
    pub fn of(
        record: &Record,
        transition: &Transition,
        action: Action,
        actor: &str,
        reason: &str,
    ) -> Draft {
        let reference = match &transition.next {
            RecordState::Applied(receipt) => Some(receipt.reference.clone()),
            RecordState::Pending { .. }
            | RecordState::AwaitingApproval { .. }
            | RecordState::FailedPermanent(_)
            | RecordState::Unknown(_)
            | RecordState::Tombstone(_) => None,
        };
        Draft {
            at: transition.now,
            key: transition.key.clone(),
            tool: record.tool.clone(),
            action,
            actor: actor.to_string(),
            reason: reason.to_string(),
            fingerprint: record.fingerprint.clone(),
            status: transition.next.status(),
            reference,
        }
    }
}

/// Where the chain ends: the last entry's sequence number and hash ([`Head::GENESIS`] for an
/// empty log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub seq: u64,
    pub hash: [u8; 32],
}

impl Head {
    pub const GENESIS: Head = Head {
        seq: 0,
        hash: GENESIS,
    };
}

/// One entry of the log, as stored and exported (one JSON object per line). Every field is
/// plain text or a number, so that a verifier reads a tampered line as it is and says what is
/// wrong with it. Hashes, keys and signatures are lowercase hex.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub seq: u64,
    /// Epoch milliseconds, from the executor's clock.
    pub at: Millis,
    pub tenant: String,
    pub environment: String,
    pub operation_key: String,
    pub tool: String,
    pub action: String,
    pub actor: String,
    pub reason: String,
    pub fingerprint: String,
    pub status: String,
    pub reference: Option<String>,
    pub prev_hash: String,
    pub hash: String,
    /// The Ed25519 public key that signed the entry; `None` when the store had no key.
    pub public_key: Option<String>,
    pub signature: Option<String>,
}

/// Why an entry's bytes cannot be made: a field that must be hex is not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} is not {len} bytes of hex")]
pub struct Malformed {
    pub field: &'static str,
    pub len: usize,
}

impl Entry {
    /// The bytes the hash and the signature cover (see the module's doc).
    pub fn signed_bytes(&self) -> Result<Vec<u8>, Malformed> {
        let prev = hex_array::<32>(&self.prev_hash).ok_or(Malformed {
            field: "prev_hash",
            len: 32,
        })?;
        let key = match &self.public_key {
            Some(text) => Some(hex_array::<32>(text).ok_or(Malformed {
                field: "public_key",
                len: 32,
            })?),
            None => None,
        };
        let mut out = Vec::with_capacity(256 + self.reason.len());
        out.extend_from_slice(DOMAIN);
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.extend_from_slice(&self.at.to_be_bytes());
        for text in [
            &self.tenant,
            &self.environment,
            &self.operation_key,
            &self.tool,
            &self.action,
            &self.actor,
            &self.reason,
            &self.fingerprint,
            &self.status,
        ] {
            text_field(&mut out, text);
        }
        match &self.reference {
            Some(reference) => {
                out.push(1);
                text_field(&mut out, reference);
            }
            None => out.push(0),
        }
        out.extend_from_slice(&prev);
        match key {
            Some(key) => {
                out.push(1);
                out.extend_from_slice(&key);
            }
            None => out.push(0),
        }
        Ok(out)
    }

    /// SHA-256 of [`Entry::signed_bytes`], as hex: what `hash` must read.
    pub fn content_hash(&self) -> Result<String, Malformed> {
        Ok(hex(&Sha256::digest(self.signed_bytes()?)))
    }

    /// The chain's head once this entry is in it.
    pub fn head(&self) -> Result<Head, Malformed> {
        Ok(Head {
            seq: self.seq,
            hash: hex_array::<32>(&self.hash).ok_or(Malformed {
                field: "hash",
                len: 32,
            })?,
        })
    }
}

fn text_field(out: &mut Vec<u8>, text: &str) {
    // Every text is bounded far below 4 GiB by the gateway (keys, names, a 500-character
    // reason); saturating keeps the encoding total rather than panicking on an absurd value.
    let len = u32::try_from(text.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(text.as_bytes());
}

/// What signs entries: an Ed25519 key the store is given.
pub trait Signer: Send + Sync + 'static {
    fn public_key(&self) -> [u8; 32];
    fn sign(&self, message: &[u8]) -> [u8; 64];
}

/// How a store seals drafts into entries: with a key, or — when the gateway was given none —
/// chained but unsigned (`verify` names such entries as unsigned).
#[derive(Clone, Default)]
pub struct Sealer {
    signer: Option<Arc<dyn Signer>>,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer")
            .field("public_key", &self.public_key().map(|k| hex(&k)))
            .finish()
    }
}

impl Sealer {
    /// Entries chained but not signed.
    pub fn unsigned() -> Sealer {
        Sealer { signer: None }
    }

    pub fn signed(signer: Arc<dyn Signer>) -> Sealer {
        Sealer {
            signer: Some(signer),
        }
    }

    pub fn public_key(&self) -> Option<[u8; 32]> {
        self.signer.as_ref().map(|s| s.public_key())
    }

    /// The entry that follows `head` for `draft`: its sequence number, the head's hash as
    /// `prev_hash`, its own hash, and the signature when there is a key.
    pub fn seal(&self, draft: &Draft, head: Head) -> Entry {
        let mut entry = Entry {
            seq: head.seq + 1,
            at: draft.at,
            tenant: draft.key.tenant().to_string(),
            environment: draft.key.environment().to_string(),
            operation_key: draft.key.as_str().to_string(),
            tool: draft.tool.clone(),
            action: draft.action.as_str().to_string(),
            actor: draft.actor.clone(),
            reason: draft.reason.clone(),
            fingerprint: draft.fingerprint.as_str().to_string(),
            status: draft.status.as_str().to_string(),
            reference: draft.reference.clone(),
            prev_hash: hex(&head.hash),
            hash: String::new(),
            public_key: self.public_key().map(|k| hex(&k)),
            signature: None,
        };
        let bytes = entry
            .signed_bytes()
            .expect("an entry made here has well-formed hex fields");
        entry.hash = hex(&Sha256::digest(&bytes));
        entry.signature = self.signer.as_ref().map(|s| hex(&s.sign(&bytes)));
        entry
    }
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    out
}

/// `N` bytes from exactly `2 * N` hex digits (either case), or `None`.
pub fn hex_array<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        let high = char::from(pair[0]).to_digit(16)?;
        let low = char::from(pair[1]).to_digit(16)?;
        out[i] = u8::try_from(high * 16 + low).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draft() -> Draft {
        Draft {
            at: 1_700_000_000_000,
            key: OperationKey::parse("acme:prod:wf:s1").unwrap(),
            tool: "tickets.create".into(),
            action: Action::Denied,
            actor: "alice".into(),
            reason: "not this customer".into(),
            fingerprint: Fingerprint::parse(&format!("sha256:{}", "a".repeat(64))).unwrap(),
            status: RecordStatus::FailedPermanent,
            reference: None,
        }
    }

    #[test]
    fn entries_chain_from_genesis() {
        let sealer = Sealer::unsigned();
        let first = sealer.seal(&draft(), Head::GENESIS);
        assert_eq!(first.seq, 1);
        assert_eq!(first.prev_hash, hex(&GENESIS));
        assert_eq!(first.content_hash().unwrap(), first.hash);
        let second = sealer.seal(&draft(), first.head().unwrap());
        assert_eq!(second.seq, 2);
        assert_eq!(second.prev_hash, first.hash);
        assert_ne!(second.hash, first.hash, "the sequence number is hashed");
    }

    #[test]
    fn every_field_is_covered_by_the_hash() {
        let entry = Sealer::unsigned().seal(&draft(), Head::GENESIS);
        let mutations: Vec<fn(&mut Entry)> = vec![
            |e| e.seq += 1,
            |e| e.at += 1,
            |e| e.tenant.push('x'),
            |e| e.environment.push('x'),
            |e| e.operation_key.push('x'),
            |e| e.tool.push('x'),
            |e| e.action = "approved".into(),
            |e| e.actor.push('x'),
            |e| e.reason.push('x'),
            |e| e.fingerprint.push('x'),
            |e| e.status = "applied".into(),
            |e| e.reference = Some(String::new()),
            |e| e.prev_hash = "1".repeat(64),
            |e| e.public_key = Some("2".repeat(64)),
        ];
        for (i, mutate) in mutations.into_iter().enumerate() {
            let mut changed = entry.clone();
            mutate(&mut changed);
            assert_ne!(changed.content_hash().unwrap(), entry.hash, "mutation {i}");
        }
    }

    #[test]
    fn texts_are_length_prefixed_so_fields_cannot_trade_bytes() {
        let mut a = Sealer::unsigned().seal(&draft(), Head::GENESIS);
        let mut b = a.clone();
        a.actor = "ali".into();
        a.reason = "cenot".into();
        b.actor = "alice".into();
        b.reason = "not".into();
        assert_ne!(a.content_hash().unwrap(), b.content_hash().unwrap());
    }

    #[test]
    fn hex_round_trips_and_refuses_bad_digits() {
        let bytes: [u8; 4] = [0, 1, 0xab, 0xff];
        assert_eq!(hex(&bytes), "0001abff");
        assert_eq!(hex_array::<4>("0001ABff"), Some(bytes));
        assert_eq!(hex_array::<4>("0001abf"), None);
        assert_eq!(hex_array::<4>("0001abfg"), None);
        assert_eq!(hex_array::<4>("+001abff"), None);
    }

    #[test]
    fn actions_parse_as_written() {
        for a in Action::ALL {
            assert_eq!(Action::parse(a.as_str()), Some(a));
        }
        assert_eq!(Action::parse("deleted"), None);
    }
}
