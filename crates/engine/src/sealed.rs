//! Encryption at rest of what a record keeps of a request and its result.
//!
//! [`SealedStore`] wraps any store. Before a record reaches the inner store, the replay-safe
//! result of an applied record and the stored request arguments are sealed with
//! XChaCha20-Poly1305 under a key from the environment; on the way back they are opened. Its
//! 192-bit nonces are drawn at random for every value, which is safe for any number of records
//! under one key (a 96-bit random nonce would cap them). The operation key is the associated
//! data, so a sealed value copied onto another row does not open there.
//!
//! Keys, fingerprints, references, statuses and the trace stay in the clear: the executor and
//! the stores decide on them, and none of them carries a request body.

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use idemgate_core::audit::Entry;
use idemgate_core::key::OperationKey;
use idemgate_core::record::{Event, Millis, Receipt, Record, RecordState, RecordStatus};
use idemgate_core::store::{
    BoxFuture, Cas, Claimed, Due, Error, Filter, RequestUpdate, Store, SweepReport, Transition,
    Waiting,
};
use idemgate_core::webhook::{JobMatch, Recorded, WebhookEvent};
use serde_json::Value;

/// Marks a sealed value; the version names the cipher and the layout (nonce ‖ ciphertext).
const PREFIX: &str = "sealed:v1:";

/// Why a key could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("encryption key: {0}")]
pub struct KeyError(String);

/// A 256-bit key and the cipher made from it.
pub struct Sealer {
    cipher: XChaCha20Poly1305,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer(..)")
    }
}

fn hex_decode(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

fn hex_encode(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    out
}

impl Sealer {
    /// A key written as 64 hexadecimal digits (32 bytes), as an environment variable holds it.
    pub fn from_hex(text: &str) -> Result<Sealer, KeyError> {
        let bytes = hex_decode(text.trim())
            .filter(|b| b.len() == 32)
            .ok_or_else(|| KeyError("expected 64 hexadecimal digits (32 bytes)".into()))?;
        let cipher = XChaCha20Poly1305::new_from_slice(&bytes)
            .map_err(|_| KeyError("not a 256-bit key".into()))?;
        Ok(Sealer { cipher })
    }

    /// Reads the key from the environment variable `name`.
    pub fn from_env(name: &str) -> Result<Sealer, KeyError> {
        let text = std::env::var(name)
            .map_err(|_| KeyError(format!("environment variable {name} is not set")))?;
        Sealer::from_hex(&text).map_err(|e| KeyError(format!("{name}: {}", e.0)))
    }

    fn seal(&self, key: &OperationKey, value: &Value) -> Result<Value, Error> {
        let mut nonce = [0u8; 24];
        getrandom_fill(&mut nonce)?;
        let plain = value.to_string();
        let sealed = self
            .cipher
            .encrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: plain.as_bytes(),
                    aad: key.as_str().as_bytes(),
                },
            )
            .map_err(|_| Error::Unavailable("sealing a stored value failed".into()))?;
        let mut bytes = nonce.to_vec();
        bytes.extend_from_slice(&sealed);
        Ok(Value::String(format!("{PREFIX}{}", hex_encode(&bytes))))
    }

    fn open(&self, key: &OperationKey, value: Value) -> Result<Value, Error> {
        let Some(hex) = value.as_str().and_then(|s| s.strip_prefix(PREFIX)) else {
            // Written before encryption was switched on: read as it is.
            return Ok(value);
        };
        let corrupt = || {
            Error::Corrupt(format!(
                "a sealed value of {key} does not open with this key"
            ))
        };
        let bytes = hex_decode(hex)
            .filter(|b| b.len() > 24)
            .ok_or_else(corrupt)?;
        let (nonce, sealed) = bytes.split_at(24);
        let nonce = XNonce::try_from(nonce).map_err(|_| corrupt())?;
        let plain = self
            .cipher
            .decrypt(
                &nonce,
                Payload {
                    msg: sealed,
                    aad: key.as_str().as_bytes(),
                },
            )
            .map_err(|_| corrupt())?;
        serde_json::from_slice(&plain).map_err(|_| corrupt())
    }

    fn seal_record(&self, mut record: Record) -> Result<Record, Error> {
        if let Some(request) = record.request.take() {
            record.request = Some(self.seal(&record.key, &request)?);
        }
        if let RecordState::Applied(receipt) = &record.state {
            let result = self.seal(&record.key, &receipt.result)?;
            record.state = RecordState::Applied(Receipt {
                reference: receipt.reference.clone(),
                result,
            });
        }
        Ok(record)
    }

    fn open_record(&self, mut record: Record) -> Result<Record, Error> {
        if let Some(request) = record.request.take() {
            record.request = Some(self.open(&record.key, request)?);
        }
        if let RecordState::Applied(receipt) = &mut record.state {
            let result = std::mem::take(&mut receipt.result);
            receipt.result = self.open(&record.key, result)?;
        }
        Ok(record)
    }
}

fn getrandom_fill(buf: &mut [u8]) -> Result<(), Error> {
    getrandom::fill(buf)
        .map_err(|_| Error::Unavailable("the operating system's random source failed".into()))
}

/// A store whose stored requests and results are sealed at rest.
pub struct SealedStore<S> {
    inner: S,
    sealer: Sealer,
}

impl<S: Store> SealedStore<S> {
    pub fn new(inner: S, sealer: Sealer) -> SealedStore<S> {
        SealedStore { inner, sealer }
    }

    pub fn inner(&self) -> &S {
        &self.inner
    }

    fn open_claimed(&self, claimed: Claimed) -> Result<Claimed, Error> {
        Ok(match claimed {
            Claimed::Inserted(r) => Claimed::Inserted(self.sealer.open_record(r)?),
            Claimed::Existing(r) => Claimed::Existing(self.sealer.open_record(r)?),
            Claimed::DuplicateIntent(key) => Claimed::DuplicateIntent(key),
        })
    }

    fn open_all(&self, records: Vec<Record>) -> Result<Vec<Record>, Error> {
        records
            .into_iter()
            .map(|r| self.sealer.open_record(r))
            .collect()
    }
}

impl<S: Store> Store for SealedStore<S> {
    fn get<'a>(&'a self, key: &'a OperationKey) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(async move {
            self.inner
                .get(key)
                .await?
                .map(|r| self.sealer.open_record(r))
                .transpose()
        })
    }

    fn claim(&self, record: Record, events: Vec<Event>) -> BoxFuture<'_, Result<Claimed, Error>> {
        Box::pin(async move {
            let sealed = self.sealer.seal_record(record)?;
            self.open_claimed(self.inner.claim(sealed, events).await?)
        })
    }

    fn claim_replaces_read(&self) -> bool {
        self.inner.claim_replaces_read()
    }

    fn claim_unless_duplicate(
        &self,
        record: Record,
        events: Vec<Event>,
        since: Millis,
    ) -> BoxFuture<'_, Result<Claimed, Error>> {
        Box::pin(async move {
            let sealed = self.sealer.seal_record(record)?;
            self.open_claimed(
                self.inner
                    .claim_unless_duplicate(sealed, events, since)
                    .await?,
            )
        })
    }

    fn transition(&self, mut t: Transition) -> BoxFuture<'_, Result<Cas, Error>> {
        Box::pin(async move {
            if let RequestUpdate::Set(request) = &t.request {
                t.request = RequestUpdate::Set(self.sealer.seal(&t.key, request)?);
            }
            if let RecordState::Applied(receipt) = &t.next {
                let result = self.sealer.seal(&t.key, &receipt.result)?;
                t.next = RecordState::Applied(Receipt {
                    reference: receipt.reference.clone(),
                    result,
                });
            }
            Ok(match self.inner.transition(t).await? {
                Cas::Done(r) => Cas::Done(self.sealer.open_record(r)?),
                Cas::Lost(r) => Cas::Lost(r.map(|r| self.sealer.open_record(r)).transpose()?),
            })
        })
    }

    /// Audit entries hold no request or result, so they pass as they are.
    fn audit_log(&self, after: u64, limit: usize) -> BoxFuture<'_, Result<Vec<Entry>, Error>> {
        self.inner.audit_log(after, limit)
    }

    fn append_events<'a>(
        &'a self,
        key: &'a OperationKey,
        events: Vec<Event>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.inner.append_events(key, events)
    }

    fn events<'a>(&'a self, key: &'a OperationKey) -> BoxFuture<'a, Result<Vec<Event>, Error>> {
        self.inner.events(key)
    }

    fn list(&self, filter: Filter) -> BoxFuture<'_, Result<Vec<Record>, Error>> {
        Box::pin(async move { self.open_all(self.inner.list(filter).await?) })
    }

    fn count<'a>(
        &'a self,
        environment: &'a str,
        status: RecordStatus,
    ) -> BoxFuture<'a, Result<u64, Error>> {
        self.inner.count(environment, status)
    }

    fn due(&self, query: Due) -> BoxFuture<'_, Result<Vec<Record>, Error>> {
        Box::pin(async move { self.open_all(self.inner.due(query).await?) })
    }

    fn waiting(&self, query: Waiting) -> BoxFuture<'_, Result<Vec<Record>, Error>> {
        Box::pin(async move { self.open_all(self.inner.waiting(query).await?) })
    }

    fn sweep<'a>(
        &'a self,
        environment: &'a str,
        now: Millis,
        limit: usize,
    ) -> BoxFuture<'a, Result<SweepReport, Error>> {
        self.inner.sweep(environment, now, limit)
    }
    // Webhook rows pass through as they are: a finished event's row holds no result, and an
    // early arrival's finish has no operation key yet to seal under (docs/async.md says so).
    fn webhook<'a>(
        &'a self,
        source: &'a str,
        event_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<WebhookEvent>, Error>> {
        self.inner.webhook(source, event_id)
    }

    fn record_webhook(&self, event: WebhookEvent) -> BoxFuture<'_, Result<Recorded, Error>> {
        self.inner.record_webhook(event)
    }

    fn webhooks_for_job<'a>(
        &'a self,
        tenant: &'a str,
        job_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<WebhookEvent>, Error>> {
        self.inner.webhooks_for_job(tenant, job_id)
    }

    fn open_jobs<'a>(&'a self, m: JobMatch<'a>) -> BoxFuture<'a, Result<Vec<Record>, Error>> {
        self.inner.open_jobs(m)
    }

    fn sweep_webhooks(&self, now: Millis, limit: usize) -> BoxFuture<'_, Result<u64, Error>> {
        self.inner.sweep_webhooks(now, limit)
    }
}
