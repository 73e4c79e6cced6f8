//! Feeds arbitrary bytes to the strict JSON reader and, for every value it accepts, checks that
//! RFC 8785 canonicalisation is a fixed point: the canonical bytes read back strictly and
//! canonicalise to themselves. A fingerprint is a digest of these bytes, so a canonical form
//! that changed when read back would make a stored request disagree with its own retry.

#![no_main]

use idemgate_core::{canonical, json};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = json::parse(data) else {
        return;
    };
    let first = match canonical::jcs(&value) {
        Ok(bytes) => bytes,
        Err(e) => panic!("a strictly parsed value does not canonicalise: {e}"),
    };
    let again = match json::parse(&first) {
        Ok(value) => value,
        Err(e) => panic!(
            "canonical bytes {} are refused by the strict reader: {e}",
            String::from_utf8_lossy(&first)
        ),
    };
    let second = canonical::jcs(&again).expect("canonical bytes canonicalise");
    assert_eq!(first, second, "canonicalisation is not idempotent");
});
