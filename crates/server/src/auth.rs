//! Tenants, tokens, roles, and the console's sessions.
//!
//! A bearer token maps to a tenant, a holder name and a role. Only the SHA-256 of each token is
//! kept; a presented token is hashed and compared against every stored hash in constant time,
//! so neither the comparison nor the position of a match leaks through timing.
//!
//! The token set can be replaced while the gateway runs ([`TokenSet`]: `serve` reloads it from
//! the configuration on SIGHUP). A console [`Session`] remembers only its token's hash, and is
//! checked against the current set on every request, so removing or revoking a token ends its
//! sessions at their next request.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

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

    pub fn len(&self) -> usize {
        self.entries.len()
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

    /// The SHA-256 of a presented token, as a session remembers it.
    pub fn digest(token: &str) -> [u8; 32] {
        Sha256::digest(token.as_bytes()).into()
    }

    /// The holder of the token whose hash is `hash`, if the set still has it. Every entry is
    /// compared, match or not.
    pub fn holder_of(&self, hash: &[u8; 32]) -> Option<Principal> {
        let mut found = None;
        for entry in &self.entries {
            if same(&entry.hash, hash) && found.is_none() {
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

/// The gateway's current tokens, replaceable while it runs. Every face reads the current set
/// per request; clones share one set.
#[derive(Debug, Clone, Default)]
pub struct TokenSet(Arc<RwLock<Arc<Tokens>>>);

impl TokenSet {
    pub fn new(tokens: Tokens) -> TokenSet {
        TokenSet(Arc::new(RwLock::new(Arc::new(tokens))))
    }

    /// The set as it is now.
    pub fn current(&self) -> Arc<Tokens> {
        match self.0.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// The executor's caller a request's bearer token names (tenant, the holder as actor, and
    /// the role), as API v1 authenticates it; `None` for a missing or unaccepted token. For a
    /// face mounted into the gateway (the MCP endpoint), which authenticates each request with
    /// the same tokens.
    pub fn caller(&self, headers: &HeaderMap) -> Option<idemgate_engine::Caller> {
        let principal = self.current().authenticate(headers).ok()?;
        Some(idemgate_engine::Caller {
            tenant: principal.tenant,
            actor: principal.name,
            role: principal.role.as_str().to_string(),
        })
    }

    /// Replaces the set: tokens left out stop working at once, and the console sessions opened
    /// with them end at their next request.
    pub fn replace(&self, tokens: Tokens) {
        let tokens = Arc::new(tokens);
        match self.0.write() {
            Ok(mut guard) => *guard = tokens,
            Err(poisoned) => *poisoned.into_inner() = tokens,
        }
    }
}

/// How long a console session lasts after sign-in, whatever it does meanwhile.
pub const SESSION_TTL: Duration = Duration::from_secs(8 * 60 * 60);

/// At most this many sessions are kept; past it, the one closest to its end is dropped.
const MAX_SESSIONS: usize = 10_000;

/// A signed-in console operator.
#[derive(Debug, Clone)]
pub struct Session {
    /// The token the operator signed in with, by hash: rechecked on every request.
    token_hash: [u8; 32],
    pub principal: Principal,
    /// The per-session CSRF token every console form carries back.
    pub csrf: String,
    pub expires_at: Instant,
    /// Set when its token was found gone: the session stays ended (and says why) until it
    /// would have expired, even if the token comes back.
    revoked: bool,
}

/// Why a request's session cookie gave no session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEnd {
    /// No such session (never opened, signed out, or the gateway restarted).
    Unknown,
    /// Past its expiry.
    Expired,
    /// Its token was removed from the configuration, or no longer names an operator of the
    /// same tenant.
    Revoked,
}

impl SessionEnd {
    /// What the sign-in page tells the operator.
    pub fn message(self) -> &'static str {
        match self {
            SessionEnd::Unknown => "Sign in with an operator token.",
            SessionEnd::Expired => "Your session expired. Sign in again.",
            SessionEnd::Revoked => {
                "Your session ended: the token it was opened with is no longer an operator token of this gateway."
            }
        }
    }
}

/// The console's sessions, in memory: a restart signs everyone out. A session id is 32 random
/// bytes; only its hash is kept as the map's key.
#[derive(Debug)]
pub struct Sessions {
    ttl: Duration,
    open: Mutex<HashMap<[u8; 32], Session>>,
}

impl Default for Sessions {
    fn default() -> Sessions {
        Sessions::new(SESSION_TTL)
    }
}

impl Sessions {
    pub fn new(ttl: Duration) -> Sessions {
        Sessions {
            ttl,
            open: Mutex::new(HashMap::new()),
        }
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Session>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens a session for the holder of `token`; returns its id (the cookie's value).
    pub fn open(&self, token: &str, principal: Principal) -> (String, Session) {
        let id = generate_token();
        let session = Session {
            token_hash: Tokens::digest(token),
            principal,
            csrf: generate_token(),
            expires_at: Instant::now() + self.ttl,
            revoked: false,
        };
        let mut open = self.lock();
        let now = Instant::now();
        open.retain(|_, s| s.expires_at > now);
        if open.len() >= MAX_SESSIONS
            && let Some(oldest) = open
                .iter()
                .min_by_key(|(_, s)| s.expires_at)
                .map(|(k, _)| *k)
        {
            open.remove(&oldest);
        }
        open.insert(Tokens::digest(&id), session.clone());
        (id, session)
    }

    /// The session of cookie value `id`, if it is open, unexpired, and its token is still an
    /// operator token of the same tenant and holder in `tokens`. A session whose token is gone
    /// is ended for good.
    pub fn find(&self, id: &str, tokens: &Tokens) -> Result<Session, SessionEnd> {
        let key = Tokens::digest(id);
        let mut open = self.lock();
        let Some(session) = open.get_mut(&key) else {
            return Err(SessionEnd::Unknown);
        };
        if session.expires_at <= Instant::now() {
            open.remove(&key);
            return Err(SessionEnd::Expired);
        }
        if session.revoked {
            return Err(SessionEnd::Revoked);
        }
        match tokens.holder_of(&session.token_hash) {
            Some(holder) if holder == session.principal && holder.role == Role::Operator => {
                Ok(session.clone())
            }
            _ => {
                session.revoked = true;
                Err(SessionEnd::Revoked)
            }
        }
    }

    /// Signs out: the session of `id` ends.
    pub fn close(&self, id: &str) {
        self.lock().remove(&Tokens::digest(id));
    }

    /// How many sessions are open (expired ones included until the next sign-in prunes them).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
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

    fn operator_token_set(name: &str, token: &str) -> Tokens {
        let mut tokens = Tokens::default();
        tokens.add(
            token,
            Principal {
                tenant: "acme".into(),
                name: name.into(),
                role: Role::Operator,
            },
        );
        tokens
    }

    #[test]
    fn a_session_ends_when_its_token_leaves_the_set() {
        let set = TokenSet::new(operator_token_set("ops", "tok-1"));
        let sessions = Sessions::default();
        let holder = set.current().verify("tok-1").unwrap();
        let (id, opened) = sessions.open("tok-1", holder);
        assert_eq!(
            sessions.find(&id, &set.current()).unwrap().csrf,
            opened.csrf
        );
        assert_eq!(
            sessions.find("not-a-session", &set.current()).unwrap_err(),
            SessionEnd::Unknown
        );
        // The same holder name under another token: the session's token is gone.
        set.replace(operator_token_set("ops", "tok-2"));
        assert_eq!(
            sessions.find(&id, &set.current()).unwrap_err(),
            SessionEnd::Revoked
        );
        // Ended for good, even if the token comes back; a new sign-in opens a new session.
        set.replace(operator_token_set("ops", "tok-1"));
        assert_eq!(
            sessions.find(&id, &set.current()).unwrap_err(),
            SessionEnd::Revoked
        );
    }

    #[test]
    fn a_session_ends_at_its_expiry_and_on_sign_out() {
        let tokens = operator_token_set("ops", "tok-1");
        let holder = tokens.verify("tok-1").unwrap();
        let expired = Sessions::new(Duration::ZERO);
        let (id, _) = expired.open("tok-1", holder.clone());
        assert_eq!(expired.find(&id, &tokens).unwrap_err(), SessionEnd::Expired);
        let sessions = Sessions::default();
        let (id, _) = sessions.open("tok-1", holder);
        sessions.close(&id);
        assert_eq!(
            sessions.find(&id, &tokens).unwrap_err(),
            SessionEnd::Unknown
        );
    }

    #[test]
    fn generated_tokens_differ() {
        let a = generate_token();
        assert_eq!(a.len(), 4 + 64);
        assert_ne!(a, generate_token());
    }
}
