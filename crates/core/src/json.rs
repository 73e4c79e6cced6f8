//! Strict JSON reading: the bytes a caller sends become a [`serde_json::Value`] only when they
//! are I-JSON (RFC 7493) that a fingerprint can represent faithfully.
//!
//! RFC 8785 reads every number as an IEEE double, so two number texts that round to the same
//! double canonicalise to the same bytes and would give two different requests one
//! fingerprint. Numbers are therefore judged by their text, exactly, before any rounding:
//!
//! - A number whose exact magnitude exceeds 2^53 is refused, however it is spelt
//!   (`9007199254740993`, `9.007199254740993e15`, `90071992547409930e-1`, `1e20`,
//!   `9007199254740992.5`): past 2^53 neighbouring integers share a double, and a check on the
//!   rounded double would let `9.007199254740993e15` through as `9007199254740992`.
//! - A number written with more precision than a double keeps is refused too
//!   (`0.1000000000000000000001` rounds to the double of `0.1`, `1e-400` to zero). A number is
//!   accepted only when its exact decimal value is the shortest decimal that reads back as its
//!   double — the form JCS itself writes. Each double then has exactly one accepted value, so
//!   accepted texts that differ as numbers always differ as fingerprints, and canonical bytes
//!   always read back. Spellings of one value (`0.1`, `0.10`, `1e-1`) are one number and are
//!   all accepted.
//!
//! Duplicate member names are refused because parsers disagree on which one wins, and a
//! fingerprint must describe exactly one request.
//!
//! [`check_numbers`] holds values built elsewhere (contract defaults read from YAML, a value
//! made in-process) to the magnitude rule; their text is gone by then, so the precision rule
//! cannot apply to them: they already are doubles.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// 2^53: past it a double cannot tell consecutive integers apart.
pub const MAX_SAFE_INTEGER: u64 = 1 << 53;

/// Deepest nesting of arrays and objects accepted by [`parse`] unless a caller says otherwise.
pub const DEFAULT_MAX_DEPTH: usize = 32;

/// A request body that is not strict JSON. The message names what is wrong and where, never
/// the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    pub message: String,
}

/// Parses `bytes` as strict JSON with the default depth bound.
pub fn parse(bytes: &[u8]) -> Result<Value, Error> {
    parse_with_depth(bytes, DEFAULT_MAX_DEPTH)
}

/// Parses `bytes` as strict JSON: UTF-8, no duplicate member names, every number within ±2^53
/// and no more precise than a double (see the module's documentation), nesting at most
/// `max_depth` deep.
pub fn parse_with_depth(bytes: &[u8], max_depth: usize) -> Result<Value, Error> {
    let numbers = RefCell::new(scan_numbers(bytes));
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = Strict {
        depth: 0,
        max_depth,
        numbers: &numbers,
    }
    .deserialize(&mut de)
    .map_err(|e| Error {
        message: describe(&e),
    })?;
    de.end().map_err(|e| Error {
        message: describe(&e),
    })?;
    Ok(value)
}

fn describe(e: &serde_json::Error) -> String {
    // serde_json's messages for syntax errors may quote a fragment of the input; ours never do.
    // Keep the classification and the position only.
    let what = match e.classify() {
        serde_json::error::Category::Io => "could not be read".to_string(),
        serde_json::error::Category::Syntax => "is not valid JSON".to_string(),
        serde_json::error::Category::Eof => "ends before the JSON value is complete".to_string(),
        serde_json::error::Category::Data => {
            // Our own refusals (duplicates, numbers, depth) are data errors; their text is ours.
            let text = e.to_string();
            match text.rfind(" at line ") {
                Some(cut) => text[..cut].to_string(),
                None => text,
            }
        }
    };
    format!(
        "request body {what} (line {}, column {})",
        e.line(),
        e.column()
    )
}

/// Checks a value built elsewhere (a contract default, say) against the same number rule.
pub fn check_numbers(value: &Value) -> Result<(), String> {
    match value {
        Value::Number(n) => check_number(n),
        Value::Array(items) => items.iter().try_for_each(check_numbers),
        Value::Object(members) => members.values().try_for_each(check_numbers),
        Value::Null | Value::Bool(_) | Value::String(_) => Ok(()),
    }
}

fn check_number(n: &Number) -> Result<(), String> {
    if let Some(u) = n.as_u64() {
        return check_u64(u);
    }
    if let Some(i) = n.as_i64() {
        return check_i64(i);
    }
    match n.as_f64() {
        Some(f) => check_f64(f),
        None => Err("a number is not representable as a double".to_string()),
    }
}

fn check_u64(u: u64) -> Result<(), String> {
    if u > MAX_SAFE_INTEGER {
        Err(beyond())
    } else {
        Ok(())
    }
}

fn check_i64(i: i64) -> Result<(), String> {
    if i.unsigned_abs() > MAX_SAFE_INTEGER {
        Err(beyond())
    } else {
        Ok(())
    }
}

fn check_f64(f: f64) -> Result<(), String> {
    if !f.is_finite() {
        return Err("a number is not finite".to_string());
    }
    // Every double of magnitude 2^53 or more is a whole number, and past 2^53 neighbouring
    // integers share a double: `18446744073709551617`, `1e20` and `100000000000000000000` all
    // arrive here and cannot be told from their neighbours. Refusing the magnitude, whatever
    // the literal's spelling, also keeps canonical output (JCS writes 1e20 as 21 digits)
    // readable by this same parser.
    if f.abs() > MAX_SAFE_INTEGER as f64 {
        return Err(beyond());
    }
    Ok(())
}

fn beyond() -> String {
    "a number is an integer beyond ±2^53, which JSON canonicalisation cannot keep distinct; send it as a string".to_string()
}

fn beyond_with_fraction() -> String {
    "a number is beyond ±2^53 and has a fraction, which no double keeps; send it as a string"
        .to_string()
}

fn too_precise() -> String {
    "a number is more precise than a double, so JSON canonicalisation would merge it with a different number; send it as a double prints it, or as a string".to_string()
}

// ---------------------------------------------------------------------------------------------
// Numbers judged by their text.

/// 2^53 written out: the magnitude rule compares digit strings with it.
const MAX_SAFE_DIGITS: &[u8] = b"9007199254740992";

/// Bound on a parsed exponent. Body sizes keep digit counts far below it, so clamping an
/// exponent such as `1e99999999999999999999` here changes no decision and keeps the exponent
/// arithmetic below from overflowing.
const EXPONENT_BOUND: i64 = 1 << 40;

/// A number text's exact value: `digits × 10^exponent`, with `digits` free of leading and
/// trailing zeros (empty for zero), so that equal values have equal representations.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Decimal {
    negative: bool,
    digits: Vec<u8>,
    exponent: i64,
}

impl Decimal {
    /// Reads a JSON number's text (`-? int frac? exp?`), or `None` for anything else.
    fn read(text: &[u8]) -> Option<Decimal> {
        let (negative, text) = match text.split_first() {
            Some((b'-', rest)) => (true, rest),
            _ => (false, text),
        };
        let (mantissa, exp) = match text.iter().position(|&c| c == b'e' || c == b'E') {
            Some(at) => (&text[..at], Some(&text[at + 1..])),
            None => (text, None),
        };
        let (int, frac) = match mantissa.iter().position(|&c| c == b'.') {
            Some(at) => (&mantissa[..at], &mantissa[at + 1..]),
            None => (mantissa, &b""[..]),
        };
        let all_digits = |s: &[u8]| !s.is_empty() && s.iter().all(u8::is_ascii_digit);
        if !all_digits(int) || (mantissa.len() > int.len() && !all_digits(frac)) {
            return None;
        }
        let mut exponent = match exp {
            None => 0,
            Some(e) => {
                let (sign, e) = match e.split_first() {
                    Some((b'-', rest)) => (-1, rest),
                    Some((b'+', rest)) => (1, rest),
                    _ => (1, e),
                };
                if !all_digits(e) {
                    return None;
                }
                let magnitude = e.iter().fold(0i64, |acc, &d| {
                    (acc * 10 + i64::from(d - b'0')).min(EXPONENT_BOUND)
                });
                sign * magnitude
            }
        };
        let mut digits: Vec<u8> = int.iter().chain(frac).copied().collect();
        exponent -= frac.len() as i64;
        let leading = digits.iter().take_while(|&&d| d == b'0').count();
        digits.drain(..leading);
        while digits.last() == Some(&b'0') {
            digits.pop();
            exponent += 1;
        }
        if digits.is_empty() {
            // Zero is zero whatever its sign or exponent (JCS writes -0 as 0).
            return Some(Decimal {
                negative: false,
                digits,
                exponent: 0,
            });
        }
        Some(Decimal {
            negative,
            digits,
            exponent,
        })
    }

    /// Whether the value is a whole number.
    fn is_integer(&self) -> bool {
        self.exponent >= 0
    }

    /// Whether the magnitude is larger than 2^53, decided on the digits.
    fn exceeds_max_safe(&self) -> bool {
        if self.digits.is_empty() {
            return false;
        }
        // The count of digits before the decimal point; 2^53 has 16 of them.
        let whole = self.digits.len() as i64 + self.exponent;
        let safe = MAX_SAFE_DIGITS.len() as i64;
        if whole != safe {
            return whole > safe;
        }
        // Same order of magnitude: compare digit by digit, padding with zeros. The digits
        // carry no trailing zeros, so any digit past the sixteenth makes the value larger.
        let padded =
            (0..MAX_SAFE_DIGITS.len()).map(|i| self.digits.get(i).copied().unwrap_or(b'0'));
        match padded.cmp(MAX_SAFE_DIGITS.iter().copied()) {
            std::cmp::Ordering::Greater => true,
            std::cmp::Ordering::Less => false,
            std::cmp::Ordering::Equal => self.digits.len() > MAX_SAFE_DIGITS.len(),
        }
    }
}

/// What one number's text may become: the double it denotes, or why it is refused.
fn judge(text: &[u8]) -> Result<f64, String> {
    let unreadable = || "a number could not be read".to_string();
    let decimal = Decimal::read(text).ok_or_else(unreadable)?;
    if decimal.exceeds_max_safe() {
        return Err(match decimal.is_integer() {
            true => beyond(),
            false => beyond_with_fraction(),
        });
    }
    // The standard library's reading is correctly rounded; the text is ASCII by construction.
    let double: f64 = std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or_else(unreadable)?;
    // Every integer up to 2^53 is a double, and its own shortest form: nothing to compare.
    if decimal.is_integer() {
        return Ok(double);
    }
    // JCS writes a double as ECMAScript does: the shortest digits that read back as it, the
    // nearer when two are as short, the even one on an exact tie (-1497903278950962.25 is
    // written `-1497903278950962.2`, where the standard library's `{:e}` rounds the tie up).
    // The text is accepted only when it denotes exactly the value JCS writes, which makes the
    // accepted value of each double unique and the canonical bytes readable again.
    let shortest = serde_json_canonicalizer::to_string(&double).map_err(|_| unreadable())?;
    match Decimal::read(shortest.as_bytes()) {
        Some(d) if d == decimal => Ok(double),
        _ => Err(too_precise()),
    }
}

/// Judges the text of every number in `bytes`, in document order.
///
/// The lexing is the least JSON needs to find numbers: a string runs to its first unescaped
/// quote, and outside strings a number is a run of number characters starting with `-` or a
/// digit (no other token contains either). serde_json then reads the same bytes and visits
/// numbers in the same order, each taking its judgement from the front of the queue. On
/// malformed input the two may part ways only after serde_json has met the error, so a
/// judgement is never taken by the wrong number.
fn scan_numbers(bytes: &[u8]) -> VecDeque<Result<f64, String>> {
    let is_number_char = |c: u8| matches!(c, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E');
    let mut judged = VecDeque::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    // An escape's next byte is never the closing quote; `\uXXXX` holds none.
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < bytes.len() && is_number_char(bytes[i]) {
                    i += 1;
                }
                judged.push_back(judge(&bytes[start..i]));
            }
            _ => i += 1,
        }
    }
    judged
}

struct Strict<'n> {
    depth: usize,
    max_depth: usize,
    /// The judgements of [`scan_numbers`] not yet taken, shared by every nested seed.
    numbers: &'n RefCell<VecDeque<Result<f64, String>>>,
}

impl<'n> Strict<'n> {
    fn nested<E: de::Error>(&self) -> Result<Strict<'n>, E> {
        if self.depth >= self.max_depth {
            return Err(E::custom(format!(
                "nesting is deeper than {} levels",
                self.max_depth
            )));
        }
        Ok(Strict {
            depth: self.depth + 1,
            max_depth: self.max_depth,
            numbers: self.numbers,
        })
    }

    /// The judgement of the number serde_json is visiting now.
    fn next_number<E: de::Error>(&self) -> Result<f64, E> {
        self.numbers
            .borrow_mut()
            .pop_front()
            .unwrap_or_else(|| Err("a number could not be read".to_string()))
            .map_err(E::custom)
    }
}

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    // Integers arrive exactly, and stay integers in the value; their text still decides.
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        self.next_number::<E>()?;
        Ok(Value::from(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        self.next_number::<E>()?;
        Ok(Value::from(v))
    }
    // The double kept is the one the text's judgement read, correctly rounded by the standard
    // library, so the value never depends on how precisely serde_json was built to read floats.
    fn visit_f64<E: de::Error>(self, _rounded: f64) -> Result<Value, E> {
        let v = self.next_number::<E>()?;
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("a number is not finite"))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let inner = self.nested::<A::Error>()?;
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(Strict { ..inner })? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let inner = self.nested::<A::Error>()?;
        let mut members = Map::new();
        while let Some(name) = map.next_key::<String>()? {
            if members.contains_key(&name) {
                let shown: String = name.chars().take(64).collect();
                return Err(de::Error::custom(format!(
                    "member name `{shown}` appears twice in one object"
                )));
            }
            let value = map.next_value_seed(Strict { ..inner })?;
            members.insert(name, value);
        }
        Ok(Value::Object(members))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, expect: Result<&str, &str>) {
        match (parse(input.as_bytes()), expect) {
            (Ok(v), Ok(json)) => assert_eq!(v, serde_json::from_str::<Value>(json).unwrap()),
            (Err(e), Err(prefix)) => assert!(
                e.message.starts_with(prefix),
                "{input}: `{}` does not start with `{prefix}`",
                e.message
            ),
            (got, expect) => panic!("{input}: got {got:?}, expected {expect:?}"),
        }
    }

    #[test]
    fn strict_json() {
        check(
            r#"{"a":1,"b":[true,null,"x"]}"#,
            Ok(r#"{"a":1,"b":[true,null,"x"]}"#),
        );
        check("9007199254740992", Ok("9007199254740992"));
        check("-9007199254740992", Ok("-9007199254740992"));
        check(
            "9007199254740993",
            Err("request body a number is an integer beyond ±2^53"),
        );
        check(
            "-9007199254740993",
            Err("request body a number is an integer beyond ±2^53"),
        );
        check(
            "18446744073709551617",
            Err("request body a number is an integer beyond ±2^53"),
        );
        check(
            "1e20",
            Err("request body a number is an integer beyond ±2^53"),
        );
        check(
            "1.5e300",
            Err("request body a number is an integer beyond ±2^53"),
        );
        check("9007199254740992.0", Ok("9007199254740992.0"));
        check(
            "9007199254740992.5",
            Err("request body a number is beyond ±2^53 and has a fraction"),
        );
        check("-1.5e-300", Ok("-1.5e-300"));
        check(
            r#"{"s":"123456789012345678901234","n":[1,2]}"#,
            Ok(r#"{"s":"123456789012345678901234","n":[1,2]}"#),
        );
        check(
            r#"{"s":"a\"99999999999999999","n":1}"#,
            Ok(r#"{"s":"a\"99999999999999999","n":1}"#),
        );
        check(
            "[1,\n 99999999999999999]",
            Err(
                "request body a number is an integer beyond ±2^53, which JSON canonicalisation cannot keep distinct; send it as a string (line 2",
            ),
        );
        check("0.1", Ok("0.1"));
        check("1e400", Err("request body is not valid JSON"));
        check(
            r#"{"a":1,"a":2}"#,
            Err("request body member name `a` appears twice in one object"),
        );
        check(
            r#"{"a":{"b":1,"b":1}}"#,
            Err("request body member name `b` appears twice"),
        );
        check(r#"{"a":1} x"#, Err("request body is not valid JSON"));
        check(
            r#"{"a":"#,
            Err("request body ends before the JSON value is complete"),
        );
        check(r#""\ud800""#, Err("request body is not valid JSON"));
    }

    const BEYOND: &str = "request body a number is an integer beyond ±2^53";
    const FRACTION: &str = "request body a number is beyond ±2^53 and has a fraction";
    const PRECISE: &str = "request body a number is more precise than a double";

    #[test]
    #[rustfmt::skip]
    fn numbers_are_judged_by_their_exact_text() {
        // Up to 2^53, whatever the spelling.
        check("9007199254740992", Ok("9007199254740992"));
        check("-9007199254740992", Ok("-9007199254740992"));
        check("9.007199254740992e15", Ok("9007199254740992.0"));
        check("90071992547409920e-1", Ok("9007199254740992.0"));
        check("9007199254740992.000", Ok("9007199254740992.0"));
        check("0.9007199254740992E+16", Ok("9007199254740992.0"));
        check("9007199254740991", Ok("9007199254740991"));
        // Past 2^53 by any amount, however it is spelt (the rounded double is 2^53 for most).
        check("9007199254740993", Err(BEYOND));
        check("9.007199254740993e15", Err(BEYOND));
        check("-9.007199254740993e15", Err(BEYOND));
        check("90071992547409930e-1", Err(BEYOND));
        check("9007199254740993.0", Err(BEYOND));
        check("9007199254740994", Err(BEYOND));
        check("1e16", Err(BEYOND));
        check("1e20", Err(BEYOND));
        check("[0, 1e99999999999999999999]", Err("request body is not valid JSON"));
        check("9007199254740992.5", Err(FRACTION));
        check("9007199254740992.0000000000000001", Err(FRACTION));
        check("-90071992547409920.5e-1", Err(FRACTION));
        // Spellings of one value are one number.
        check("0.1", Ok("0.1"));
        check("0.10", Ok("0.1"));
        check("1e-1", Ok("0.1"));
        check("1E-1", Ok("0.1"));
        check("-0", Ok("-0"));
        check("-0.0", Ok("-0.0"));
        check("0e99999999999999999999", Ok("0.0"));
        // Each double's shortest form, 17 digits included, and tiny numbers a double keeps.
        check("0.30000000000000004", Ok("0.30000000000000004"));
        check("4503599627370495.5", Ok("4503599627370495.5"));
        check("123.456e-5", Ok("0.00123456"));
        check("1e-300", Ok("1e-300"));
        check("5e-324", Ok("5e-324"));
        check("2.2250738585072014e-308", Ok("2.2250738585072014e-308"));
        // An exact tie between two shortest forms: the even one, as JCS writes it, and not the other.
        check("-1497903278950962.2", Ok("-1497903278950962.25"));
        check("-1497903278950962.3", Err(PRECISE));
        // More precision than a double keeps: each shares its double with a different number.
        check("0.1000000000000000000001", Err(PRECISE));
        check("0.10000000000000001", Err(PRECISE));
        check("1.00000000000000001", Err(PRECISE));
        check("9007199254740991.5", Err(PRECISE));
        check("4.9406564584124654e-324", Err(PRECISE));
        check("1e-400", Err(PRECISE));
        check(r#"{"a":[1,2,{"b":"0.1000000000000000000001","c":0.3}]}"#, Ok(r#"{"a":[1,2,{"b":"0.1000000000000000000001","c":0.3}]}"#));
        check("[1,\n 0.1000000000000000000001]", Err("request body a number is more precise than a double, so JSON canonicalisation would merge it with a different number; send it as a double prints it, or as a string (line 2"));
    }

    #[test]
    fn the_digits_of_2_to_the_53_are_right() {
        assert_eq!(MAX_SAFE_DIGITS, MAX_SAFE_INTEGER.to_string().as_bytes());
    }

    /// Reads `text` as the one number of a body: `Ok` with its double, or the message.
    fn number(text: &str) -> Result<f64, String> {
        match parse(text.as_bytes()) {
            Ok(v) => Ok(v.as_f64().expect("a number")),
            Err(e) => Err(e.message),
        }
    }

    /// Any finite double of magnitude below 2^53, every binary exponent equally likely
    /// (subnormals included), built from its fields so that no case is rejected.
    fn safe_double() -> impl proptest::strategy::Strategy<Value = f64> {
        use proptest::strategy::Strategy;
        (proptest::bool::ANY, 0u64..=1075, 0u64..1 << 52).prop_map(
            |(negative, exponent, fraction)| {
                f64::from_bits(u64::from(negative) << 63 | exponent << 52 | fraction)
            },
        )
    }

    proptest::proptest! {
        /// Every double within ±2^53 is accepted as JCS and serde_json write it, and reads
        /// back as itself.
        #[test]
        fn every_safe_double_reads_back_as_itself(f in safe_double()) {
            let jcs = serde_json_canonicalizer::to_string(&f).unwrap();
            for text in [serde_json::to_string(&f).unwrap(), jcs] {
                proptest::prop_assert_eq!(number(&text), Ok(f), "{}", text);
            }
        }

        /// A different value that rounds to the same double is never accepted: a digit added
        /// anywhere past a double's shortest form either changes the double or is refused.
        #[test]
        fn no_two_accepted_values_share_a_double(
            f in safe_double(),
            zeros in 0usize..20,
            digit in 1u8..=9,
        ) {
            let shortest = format!("{f:e}");
            let (mantissa, exponent) = shortest.split_once('e').unwrap();
            let point = if mantissa.contains('.') { "" } else { "." };
            let longer = format!("{mantissa}{point}{}{}e{exponent}", "0".repeat(zeros), digit as char);
            if let Ok(g) = number(&longer) {
                proptest::prop_assert_ne!(g, f, "{} and {} share a double", longer, shortest);
            }
        }

        /// The magnitude rule agrees with exact integer arithmetic, for a value written with
        /// its decimal point in each place and with an exponent.
        #[test]
        fn magnitude_is_decided_exactly(
            n in (MAX_SAFE_INTEGER as u128 - 2000)..(MAX_SAFE_INTEGER as u128 * 100_000 + 2000),
            scale in 0u32..6,
        ) {
            let beyond = n > MAX_SAFE_INTEGER as u128 * 10u128.pow(scale);
            let digits = n.to_string();
            let (int, frac) = digits.split_at(digits.len() - scale as usize);
            let pointed = if scale == 0 { digits.clone() } else { format!("{int}.{frac}") };
            for text in [pointed, format!("{digits}e-{scale}")] {
                let magnitude_refused = number(&text).is_err_and(|m| m.contains("beyond ±2^53"));
                proptest::prop_assert_eq!(magnitude_refused, beyond, "{}", text);
            }
        }
    }

    #[test]
    fn depth_is_bounded() {
        let deep = "[".repeat(DEFAULT_MAX_DEPTH) + &"]".repeat(DEFAULT_MAX_DEPTH);
        assert!(parse(deep.as_bytes()).is_ok());
        let deeper = "[".repeat(DEFAULT_MAX_DEPTH + 1) + &"]".repeat(DEFAULT_MAX_DEPTH + 1);
        let err = parse(deeper.as_bytes()).unwrap_err();
        assert!(
            err.message.contains("nesting is deeper than 32 levels"),
            "{err}"
        );
    }

    #[test]
    fn invalid_utf8_is_refused() {
        assert!(parse(b"\"\xff\"").is_err());
    }
}
