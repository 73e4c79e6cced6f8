//! Durations as contracts write them: `90s`, `15m`, `24h`, `7d`, or a bare number of seconds.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A whole number of seconds, written the way people write retention rules.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Span(pub u64);

impl Span {
    pub fn seconds(self) -> u64 {
        self.0
    }
    pub fn millis(self) -> i64 {
        i64::try_from(self.0.saturating_mul(1000)).unwrap_or(i64::MAX)
    }
    pub fn as_duration(self) -> Duration {
        Duration::from_secs(self.0)
    }

    pub fn parse(text: &str) -> Result<Span, String> {
        let text = text.trim();
        let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
            Some(i) => text.split_at(i),
            None => (text, "s"),
        };
        let n: u64 = digits
            .parse()
            .map_err(|_| format!("`{text}` is not a duration such as 90s, 15m, 24h or 7d"))?;
        let scale = match unit {
            "s" => 1,
            "m" => 60,
            "h" => 3600,
            "d" => 86_400,
            _ => return Err(format!("`{text}` has unit `{unit}`; use s, m, h or d")),
        };
        n.checked_mul(scale)
            .map(Span)
            .ok_or_else(|| format!("`{text}` is too long a duration"))
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        if s != 0 && s.is_multiple_of(86_400) {
            write!(f, "{}d", s / 86_400)
        } else if s != 0 && s.is_multiple_of(3600) {
            write!(f, "{}h", s / 3600)
        } else if s != 0 && s.is_multiple_of(60) {
            write!(f, "{}m", s / 60)
        } else {
            write!(f, "{s}s")
        }
    }
}

impl fmt::Debug for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Serialize for Span {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Span {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Span, D::Error> {
        // A plain visitor, not an untagged enum: the error is raised while the deserializer
        // still knows the value's position, so a contract error names the exact line and field.
        struct SpanVisitor;
        impl serde::de::Visitor<'_> for SpanVisitor {
            type Value = Span;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as 90s, 15m, 24h, 7d or a number of seconds")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Span, E> {
                Ok(Span(n))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Span, E> {
                u64::try_from(n)
                    .map(Span)
                    .map_err(|_| E::custom("a duration cannot be negative"))
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Span, E> {
                Span::parse(text).map_err(E::custom)
            }
        }
        d.deserialize_any(SpanVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans() {
        for (text, secs) in [
            ("90s", 90),
            ("15m", 900),
            ("24h", 86_400),
            ("7d", 604_800),
            ("30", 30),
        ] {
            assert_eq!(Span::parse(text), Ok(Span(secs)), "{text}");
        }
        assert!(Span::parse("7w").unwrap_err().contains("unit `w`"));
        assert!(Span::parse("d").is_err());
        assert_eq!(Span(604_800).to_string(), "7d");
        assert_eq!(Span(90).to_string(), "90s");
    }
}
