//! The operation key: the scoped identity of one intended business action.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Longest operation key accepted, in bytes, separators included.
pub const MAX_KEY_BYTES: usize = 255;

/// `tenant:environment:workflow_id:step_id`.
///
/// The tenant comes from the caller's credentials and the environment from configuration; the
/// workflow and step come from the calling application. None of the four ever comes from the
/// model. Each part is printable ASCII without `:` so that the joined form parses back into the
/// same four parts, and the whole is bounded so that it fits an index and a header.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct OperationKey {
    joined: String,
    // Byte offsets of the three separators in `joined`.
    seps: [usize; 3],
}

/// Why a key was refused. Each variant names the part at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("operation key part `{part}` is empty")]
    Empty { part: &'static str },
    #[error("operation key part `{part}` contains `:`, which separates the parts")]
    Colon { part: &'static str },
    #[error(
        "operation key part `{part}` contains a character that is not printable ASCII at byte {at}"
    )]
    NotPrintable { part: &'static str, at: usize },
    #[error("operation key is {len} bytes long; at most {MAX_KEY_BYTES} are allowed")]
    TooLong { len: usize },
    #[error(
        "operation key `{0}` does not have four `:`-separated parts (tenant:environment:workflow_id:step_id)"
    )]
    Shape(String),
}

const PARTS: [&str; 4] = ["tenant", "environment", "workflow_id", "step_id"];

fn check_part(part: &'static str, value: &str) -> Result<(), Error> {
    if value.is_empty() {
        return Err(Error::Empty { part });
    }
    for (at, b) in value.bytes().enumerate() {
        if b == b':' {
            return Err(Error::Colon { part });
        }
        // Printable ASCII excludes space as well: a key travels in headers and URLs.
        if !(0x21..=0x7e).contains(&b) {
            return Err(Error::NotPrintable { part, at });
        }
    }
    Ok(())
}

impl OperationKey {
    /// Builds a key from its four parts, checking each.
    pub fn new(
        tenant: &str,
        environment: &str,
        workflow_id: &str,
        step_id: &str,
    ) -> Result<OperationKey, Error> {
        let values = [tenant, environment, workflow_id, step_id];
        for (part, value) in PARTS.iter().zip(values) {
            check_part(part, value)?;
        }
        let len = values.iter().map(|v| v.len()).sum::<usize>() + 3;
        if len > MAX_KEY_BYTES {
            return Err(Error::TooLong { len });
        }
        let mut joined = String::with_capacity(len);
        let mut seps = [0; 3];
        for (i, value) in values.iter().enumerate() {
            if i > 0 {
                seps[i - 1] = joined.len();
                joined.push(':');
            }
            joined.push_str(value);
        }
        Ok(OperationKey { joined, seps })
    }

    /// Parses the joined form `tenant:environment:workflow_id:step_id`.
    pub fn parse(joined: &str) -> Result<OperationKey, Error> {
        let parts: Vec<&str> = joined.split(':').collect();
        if parts.len() != 4 {
            if joined.len() > MAX_KEY_BYTES {
                return Err(Error::TooLong { len: joined.len() });
            }
            return Err(Error::Shape(joined.chars().take(64).collect()));
        }
        OperationKey::new(parts[0], parts[1], parts[2], parts[3])
    }

    pub fn tenant(&self) -> &str {
        &self.joined[..self.seps[0]]
    }
    pub fn environment(&self) -> &str {
        &self.joined[self.seps[0] + 1..self.seps[1]]
    }
    pub fn workflow_id(&self) -> &str {
        &self.joined[self.seps[1] + 1..self.seps[2]]
    }
    pub fn step_id(&self) -> &str {
        &self.joined[self.seps[2] + 1..]
    }
    pub fn as_str(&self) -> &str {
        &self.joined
    }
}

impl fmt::Display for OperationKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.joined)
    }
}

impl fmt::Debug for OperationKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OperationKey({})", self.joined)
    }
}

impl TryFrom<String> for OperationKey {
    type Error = Error;
    fn try_from(value: String) -> Result<Self, Error> {
        OperationKey::parse(&value)
    }
}

impl From<OperationKey> for String {
    fn from(key: OperationKey) -> String {
        key.joined
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(parts: [&str; 4], expect: Result<&str, &str>) {
        let got = OperationKey::new(parts[0], parts[1], parts[2], parts[3]);
        match (got, expect) {
            (Ok(key), Ok(joined)) => {
                assert_eq!(key.as_str(), joined);
                let back = OperationKey::parse(joined).unwrap();
                assert_eq!(back, key);
                assert_eq!(
                    [
                        back.tenant(),
                        back.environment(),
                        back.workflow_id(),
                        back.step_id()
                    ],
                    parts
                );
            }
            (Err(err), Err(message)) => assert_eq!(err.to_string(), message),
            (got, expect) => panic!("{parts:?}: got {got:?}, expected {expect:?}"),
        }
    }

    #[test]
    fn keys() {
        check(
            ["acme", "production", "run_827", "record_issue"],
            Ok("acme:production:run_827:record_issue"),
        );
        check(["a", "b", "c", "-"], Ok("a:b:c:-"));
        check(
            ["", "b", "c", "d"],
            Err("operation key part `tenant` is empty"),
        );
        check(
            ["a", "b", "", "d"],
            Err("operation key part `workflow_id` is empty"),
        );
        check(
            ["a", "b", "c:x", "d"],
            Err("operation key part `workflow_id` contains `:`, which separates the parts"),
        );
        check(
            ["a", "b", "c", "d e"],
            Err(
                "operation key part `step_id` contains a character that is not printable ASCII at byte 1",
            ),
        );
        check(
            ["a", "é", "c", "d"],
            Err(
                "operation key part `environment` contains a character that is not printable ASCII at byte 0",
            ),
        );
        check(
            ["a", "b", "c", "d\n"],
            Err(
                "operation key part `step_id` contains a character that is not printable ASCII at byte 1",
            ),
        );
    }

    #[test]
    fn length_bound_counts_separators() {
        let long = "w".repeat(MAX_KEY_BYTES - 6);
        assert!(OperationKey::new("a", "b", &long, "d").is_ok());
        let longer = "w".repeat(MAX_KEY_BYTES - 5);
        assert_eq!(
            OperationKey::new("a", "b", &longer, "d").unwrap_err(),
            Error::TooLong {
                len: MAX_KEY_BYTES + 1
            }
        );
    }

    #[test]
    fn parse_refuses_wrong_shape() {
        assert!(matches!(OperationKey::parse("a:b:c"), Err(Error::Shape(_))));
        assert!(matches!(
            OperationKey::parse("a:b:c:d:e"),
            Err(Error::Shape(_))
        ));
    }
}
