//! Ed25519 for idemgate's audit log: the key a gateway signs entries with, and the offline
//! verifier of an exported log.
//!
//! Reading order:
//!
//! - [`SigningKey`] — a 32-byte Ed25519 seed, written as 64 hex digits in [`KEY_VAR`]
//!   (`IDEMGATE_AUDIT_KEY`); it implements core's [`Signer`], so a store seals entries with it.
//!   [`sealer_from_env`] is what `serve` calls: no variable, unsigned entries; a malformed one,
//!   an error that names it.
//! - [`PublicKey`] — what an operator keeps to verify with (64 hex digits).
//! - [`verify`] — reads an export (JSON lines) and checks, entry by entry: the sequence number
//!   follows the previous one, `prev_hash` is the previous entry's hash, `hash` is the hash of
//!   the entry's content, and the signature verifies under the given key. The first entry that
//!   fails is named with what is wrong ([`Broken`]).
//!
//! The entry format and its canonical bytes live in `idemgate_core::audit`; this crate adds
//! only the curve arithmetic, so that core stays free of it.

use std::io::BufRead;
use std::sync::Arc;

use ed25519_dalek::{Signer as _, Verifier as _};
use idemgate_core::audit::{Entry, GENESIS, Head, Sealer, Signer, hex, hex_array};

/// The environment variable that holds the gateway's audit signing key (64 hex digits, the
/// Ed25519 seed).
pub const KEY_VAR: &str = "IDEMGATE_AUDIT_KEY";

/// Why a key's text was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} must be 64 hex digits (32 bytes); {found}")]
pub struct KeyError {
    what: String,
    found: String,
}

fn key_bytes(what: &str, text: &str) -> Result<[u8; 32], KeyError> {
    let text = text.trim();
    hex_array::<32>(text).ok_or_else(|| KeyError {
        what: what.to_string(),
        found: if text.is_empty() {
            "it is empty".into()
        } else if text.chars().all(|c| c.is_ascii_hexdigit()) {
            format!("it has {} digits", text.len())
        } else {
            "it contains characters that are not hex digits".into()
        },
    })
}

/// An Ed25519 signing key.
pub struct SigningKey(ed25519_dalek::SigningKey);

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The seed is a secret: only the public half is ever printed.
        f.debug_struct("SigningKey")
            .field("public", &self.public().to_string())
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// A new key from the operating system's random source.
    pub fn generate() -> Result<SigningKey, getrandom::Error> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed)?;
        Ok(SigningKey(ed25519_dalek::SigningKey::from_bytes(&seed)))
    }

    /// The key from its seed as 64 hex digits (`what` names where the text came from).
    pub fn parse(what: &str, text: &str) -> Result<SigningKey, KeyError> {
        Ok(SigningKey(ed25519_dalek::SigningKey::from_bytes(
            &key_bytes(what, text)?,
        )))
    }

    /// The seed as 64 hex digits: the secret to keep in [`KEY_VAR`].
    pub fn seed_hex(&self) -> String {
        hex(&self.0.to_bytes())
    }

    pub fn public(&self) -> PublicKey {
        PublicKey(self.0.verifying_key())
    }
}

impl Signer for SigningKey {
    fn public_key(&self) -> [u8; 32] {
        self.0.verifying_key().to_bytes()
    }

    fn sign(&self, message: &[u8]) -> [u8; 64] {
        self.0.sign(message).to_bytes()
    }
}

/// An Ed25519 public key: what `idemgate audit verify --public-key` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublicKey(ed25519_dalek::VerifyingKey);

impl PublicKey {
    pub fn parse(what: &str, text: &str) -> Result<PublicKey, KeyError> {
        let bytes = key_bytes(what, text)?;
        ed25519_dalek::VerifyingKey::from_bytes(&bytes)
            .map(PublicKey)
            .map_err(|_| KeyError {
                what: what.to_string(),
                found: "it is not a point of the curve (not an Ed25519 public key)".into(),
            })
    }
}

impl std::fmt::Display for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hex(self.0.as_bytes()))
    }
}

/// The sealer the environment asks for: signed with [`KEY_VAR`]'s key, or unsigned when the
/// variable is not set. A set but malformed variable is an error — a gateway that meant to
/// sign must not start writing unsigned entries.
pub fn sealer_from_env() -> Result<Sealer, KeyError> {
    match std::env::var(KEY_VAR) {
        Ok(text) => Ok(Sealer::signed(Arc::new(SigningKey::parse(KEY_VAR, &text)?))),
        Err(std::env::VarError::NotPresent) => Ok(Sealer::unsigned()),
        Err(std::env::VarError::NotUnicode(_)) => Err(KeyError {
            what: KEY_VAR.into(),
            found: "it is not UTF-8".into(),
        }),
    }
}

/// What a verification checks signatures against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Every entry must be signed by this key.
    SignedBy(PublicKey),
    /// Only the chain: sequence, links and hashes. Proves nothing against someone who can write
    /// the store (they can rebuild the chain), only against accidents and partial edits.
    ChainOnly,
}

/// A log that verified: how far it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub entries: u64,
    /// The last entry's sequence number and hash (0 and the genesis hash for an empty log):
    /// compare with the store's to detect a removed tail, which no file can show by itself.
    pub last_seq: u64,
    pub last_hash: String,
    /// Entries without a signature (only with [`Expect::ChainOnly`]; otherwise the first is an
    /// error).
    pub unsigned: u64,
}

/// The first entry that failed, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", describe(.line, .seq, .problem))]
pub struct Broken {
    /// The line of the file, from 1.
    pub line: u64,
    /// The entry's sequence number, when the line could be read as an entry.
    pub seq: Option<u64>,
    pub problem: String,
}

fn describe(line: &u64, seq: &Option<u64>, problem: &str) -> String {
    match seq {
        Some(seq) => format!("entry {seq} (line {line}): {problem}"),
        None => format!("line {line}: {problem}"),
    }
}

/// Verifies an exported log, in order, and stops at the first broken entry.
pub fn verify(input: impl BufRead, expect: Expect) -> Result<Report, Broken> {
    let mut head = Head::GENESIS;
    let mut report = Report {
        entries: 0,
        last_seq: 0,
        last_hash: hex(&GENESIS),
        unsigned: 0,
    };
    for (index, line) in input.lines().enumerate() {
        let line_no = index as u64 + 1;
        let broken = |seq: Option<u64>, problem: String| Broken {
            line: line_no,
            seq,
            problem,
        };
        let line = line.map_err(|e| broken(None, format!("cannot be read: {e}")))?;
        if line.trim().is_empty() {
            continue;
        }
        let entry: Entry = serde_json::from_str(&line)
            .map_err(|e| broken(None, format!("not an audit entry: {e}")))?;
        let seq = Some(entry.seq);
        let expected = head.seq + 1;
        if entry.seq > expected {
            let missing = if entry.seq == expected + 1 {
                format!("entry {expected} is missing")
            } else {
                format!("entries {expected} to {} are missing", entry.seq - 1)
            };
            return Err(broken(seq, format!("{missing} (expected {expected} here)")));
        }
        if entry.seq < expected {
            return Err(broken(
                seq,
                format!(
                    "out of order: it comes after entry {} (expected {expected} here)",
                    head.seq
                ),
            ));
        }
        if hex_array::<32>(&entry.prev_hash) != Some(head.hash) {
            return Err(broken(
                seq,
                if head.seq == 0 {
                    "prev_hash is not the genesis hash (64 zeros): the log does not start here"
                        .into()
                } else {
                    format!(
                        "prev_hash does not match entry {}'s hash (an entry before it was changed or replaced)",
                        head.seq
                    )
                },
            ));
        }
        let hash = entry
            .content_hash()
            .map_err(|e| broken(seq, e.to_string()))?;
        if hash != entry.hash {
            return Err(broken(
                seq,
                "hash does not match the entry's content (a field was changed)".into(),
            ));
        }
        check_signature(&entry, expect, &mut report).map_err(|p| broken(seq, p))?;
        head = entry.head().map_err(|e| broken(seq, e.to_string()))?;
        report.entries += 1;
        report.last_seq = entry.seq;
        report.last_hash = entry.hash;
    }
    Ok(report)
}

fn check_signature(entry: &Entry, expect: Expect, report: &mut Report) -> Result<(), String> {
    let key = match expect {
        Expect::SignedBy(key) => key,
        Expect::ChainOnly => {
            if entry.signature.is_none() {
                report.unsigned += 1;
            }
            return Ok(());
        }
    };
    let (Some(claimed), Some(signature)) = (&entry.public_key, &entry.signature) else {
        return Err(
            "unsigned (the gateway that wrote it had no IDEMGATE_AUDIT_KEY): nothing proves who wrote it"
                .into(),
        );
    };
    if hex_array::<32>(claimed) != Some(*key.0.as_bytes()) {
        return Err(format!("signed by another key ({claimed}), not {key}"));
    }
    let signature =
        hex_array::<64>(signature).ok_or_else(|| "signature is not 64 bytes of hex".to_string())?;
    let bytes = entry.signed_bytes().map_err(|e| e.to_string())?;
    key.0
        .verify(&bytes, &ed25519_dalek::Signature::from_bytes(&signature))
        .map_err(|_| {
            format!(
                "signature does not verify under {key} (the entry or its signature was changed)"
            )
        })
}
