//! Tenants, tokens and roles.
//!
//! A bearer token maps to a tenant, a holder name and a role. Only the SHA-256 of each token is
//! kept; a presented token is hashed and compared against every stored hash in constant time,
//! so neither the comparison nor the position of a match leaks through timing.

use std::fmt;

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::config::TenantConfig;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Invoke tools and read its own tenant's operations.
    Agent,
    /// Also reconcile, approve, deny and list.
    Operator,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Agent => "agent",
            Role::Operator => "operator",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub tenant: String,
    /// The token holder's name: the actor recorded on operations and operator actions.
    pub name: String,
    pub role: Role,
}

#[derive(Debug, Clone)]
struct Entry {
    hash: [u8; 32],
    principal: Principal,
}

/// Every configured token, by hash.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    entries: Vec<Entry>,
}

/// Why a request carried no usable credentials. Deliberately coarse: a caller learns only that
/// the token was missing or not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthError {
    Missing,
    Invalid,
}

/// The lowercase hex SHA-256 of a token, as the configuration stores it.
pub fn hash_token(token: &str) -> String {
    hex(&Sha256::digest(token.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<[u8; 32]> {
    let text = text.trim().as_bytes();
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in text.chunks(2).enumerate() {
        let digit = |c: u8| (c as char).to_digit(16);
        out[i] = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
    }
    Some(out)
}

/// Compares two hashes without an early exit.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

impl Tokens {
    /// The tokens of the configured tenants. Hashes were checked when the file was read.
    pub fn from_config(tenants: &[TenantConfig]) -> Tokens {
        let mut tokens = Tokens::default();
        for tenant in tenants {
            for token in &tenant.tokens {
                if let Some(hash) = unhex(&token.sha256) {
                    tokens.entries.push(Entry {
                        hash,
                        principal: Principal {
                            tenant: tenant.name.clone(),
                            name: token.name.clone(),
                            role: token.role,
                        },
                    });
                }
            }
        }
        tokens
    }

    /// Adds a token given in clear text (the development tokens).
    pub fn add(&mut self, token: &str, principal: Principal) {
        let hash: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        self.entries.push(Entry { hash, principal });
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Finds the principal of a presented token. Every entry is compared, match or not.
    pub fn verify(&self, token: &str) -> Option<Principal> {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for entry in &self.entries {
            if same(&entry.hash, &presented) && found.is_none() {
                found = Some(entry.principal.clone());
            }
        }
        found
    }

    /// Authenticates a request by its `Authorization: Bearer <token>` header.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Principal, AuthError> {
        let mut values = headers.get_all(AUTHORIZATION).iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            return Err(AuthError::Missing);
        };
        let value = value.to_str().map_err(|_| AuthError::Invalid)?;
        let (scheme, token) = value.split_once(' ').ok_or(AuthError::Invalid)?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(AuthError::Invalid);
        }
        let token = token.trim();
        if token.is_empty() {
            return Err(AuthError::Invalid);
        }
        self.verify(token).ok_or(AuthError::Invalid)
    }
}

/// A fresh random token: 32 bytes from the operating system, hex, with a recognisable prefix.
pub fn generate_token() -> String {
    let mut bytes = [0u8; 32];
    let filled = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .is_ok();
    if !filled {
        // No /dev/urandom: fall back on the standard library's per-process random hasher keys.
        use std::hash::{BuildHasher, Hasher};
        for chunk in bytes.chunks_mut(8) {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or_default(),
            );
            chunk.copy_from_slice(&h.finish().to_le_bytes()[..chunk.len()]);
        }
    }
    format!("idg_{}", hex(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TokenConfig;

    #[test]
    fn tokens_verify_by_hash_only() {
        let tenants = vec![TenantConfig {
            name: "acme".into(),
            tokens: vec![TokenConfig {
                name: "bot".into(),
                sha256: hash_token("secret-1"),
                role: Role::Agent,
            }],
        }];
        let tokens = Tokens::from_config(&tenants);
        assert_eq!(tokens.verify("secret-1").unwrap().tenant, "acme");
        assert!(tokens.verify("secret-2").is_none());
        assert!(tokens.verify("").is_none());
        let mut headers = HeaderMap::new();
        assert_eq!(tokens.authenticate(&headers), Err(AuthError::Missing));
        headers.insert(AUTHORIZATION, "Bearer secret-1".parse().unwrap());
        assert_eq!(tokens.authenticate(&headers).unwrap().role, Role::Agent);
        headers.insert(AUTHORIZATION, "Basic secret-1".parse().unwrap());
        assert_eq!(tokens.authenticate(&headers), Err(AuthError::Invalid));
    }

    #[test]
    fn generated_tokens_differ() {
        let a = generate_token();
        assert_eq!(a.len(), 4 + 64);
        assert_ne!(a, generate_token());
    }
}
