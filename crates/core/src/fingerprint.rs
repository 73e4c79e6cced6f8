//! The request fingerprint: `sha256:` and the hex digest of canonical bytes.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::canonical::Canonical;

/// Proves what an operation contained. Recomputed on every delivery from the arguments; never
/// taken from the caller.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Fingerprint(String);

pub const ALGORITHM: &str = "sha256";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a fingerprint of the form sha256:<64 lowercase hex digits>")]
pub struct Error(pub String);

impl Fingerprint {
    /// The fingerprint of canonical bytes; the only way to make one from a request.
    pub fn of(canonical: &Canonical) -> Fingerprint {
        let digest = Sha256::digest(canonical.as_bytes());
        let mut text = String::with_capacity(ALGORITHM.len() + 1 + 64);
        text.push_str(ALGORITHM);
        text.push(':');
        for byte in digest.iter() {
            text.push(char::from_digit(u32::from(byte >> 4), 16).unwrap());
            text.push(char::from_digit(u32::from(byte & 0xf), 16).unwrap());
        }
        Fingerprint(text)
    }

    /// Reads back a fingerprint that a store persisted.
    pub fn parse(text: &str) -> Result<Fingerprint, Error> {
        let hex = text
            .strip_prefix("sha256:")
            .ok_or_else(|| Error(text.chars().take(80).collect()))?;
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(Error(text.chars().take(80).collect()));
        }
        Ok(Fingerprint(text.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", self.0)
    }
}

impl TryFrom<String> for Fingerprint {
    type Error = Error;
    fn try_from(text: String) -> Result<Self, Error> {
        Fingerprint::parse(&text)
    }
}

impl From<Fingerprint> for String {
    fn from(fp: Fingerprint) -> String {
        fp.0
    }
}
