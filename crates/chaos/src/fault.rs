//! What the proxy does to one request: a [`Fault`], chosen by the first [`Rule`] that matches
//! it, or else drawn at the configured [`Rates`] from a seeded source ([`Faults::decide`]).
//!
//! The draw is a pure function of the seed, the request's `Idempotency-Key` and its number
//! among that key's requests (`nth`, from 1), not of the order in which requests of different
//! keys arrive: concurrent callers race each other, but the same seed still gives every key the
//! same faults on every run. Requests without a key are numbered among themselves, in arrival
//! order, so their faults repeat only when they arrive in the same order.

use std::fmt;
use std::time::Duration;

/// One request's fate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward it and hand back the upstream's answer.
    Pass,
    /// Forward it, then close the caller's connection without an answer: the upstream may
    /// have committed and the caller cannot know.
    Drop,
    /// Reset the caller's connection (TCP RST) before forwarding: the upstream never sees it.
    Reset,
    /// Hold it this long before forwarding. It is forwarded even when the caller gave up
    /// meanwhile: a request that arrives after its caller stopped waiting.
    Delay(Duration),
    /// Forward it, then answer this 5xx status instead of the upstream's answer.
    Error(u16),
    /// Forward it twice at once; the caller is told the first copy's answer.
    Duplicate,
    /// Forward it, then answer `200` with a body that is not JSON.
    Malformed,
}

impl Fault {
    /// The fault's name in rules, flags and the ledger.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Pass => "pass",
            Fault::Drop => "drop",
            Fault::Reset => "reset",
            Fault::Delay(_) => "delay",
            Fault::Error(_) => "error",
            Fault::Duplicate => "duplicate",
            Fault::Malformed => "malformed",
        }
    }

    /// Whether the upstream receives the request at all.
    pub fn forwards(self) -> bool {
        match self {
            Fault::Reset => false,
            Fault::Pass
            | Fault::Drop
            | Fault::Delay(_)
            | Fault::Error(_)
            | Fault::Duplicate
            | Fault::Malformed => true,
        }
    }

    /// Reads `pass`, `drop`, `reset`, `delay` (for `default_delay`), `delay=2s`, `error` (for
    /// `default_status`), `error=503`, `duplicate` or `malformed`.
    pub fn parse(
        text: &str,
        default_delay: Duration,
        default_status: u16,
    ) -> Result<Fault, String> {
        let (name, value) = match text.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (text, None),
        };
        let fault = match (name, value) {
            ("pass", None) => Fault::Pass,
            ("drop", None) => Fault::Drop,
            ("reset", None) => Fault::Reset,
            ("duplicate", None) => Fault::Duplicate,
            ("malformed", None) => Fault::Malformed,
            ("delay", None) => Fault::Delay(default_delay),
            ("delay", Some(v)) => Fault::Delay(parse_duration(v)?),
            ("error", None) => Fault::Error(default_status),
            ("error", Some(v)) => Fault::Error(parse_status(v)?),
            ("pass" | "drop" | "reset" | "duplicate" | "malformed", Some(_)) => {
                return Err(format!("fault `{name}` takes no value"));
            }
            _ => {
                return Err(format!(
                    "`{text}` is not a fault: pass, drop, reset, delay[=2s], error[=502], duplicate, malformed"
                ));
            }
        };
        Ok(fault)
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Delay(d) => write!(f, "delay={}ms", d.as_millis()),
            Fault::Error(status) => write!(f, "error={status}"),
            other => f.write_str(other.name()),
        }
    }
}

/// A duration as contracts and flags write it: `250ms`, `2s`, `1m`, or a bare number of
/// seconds, at most an hour (the HTTP downstream's reading of its timeouts).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    idemgate_downstream_http::Timeout::parse(text).map(|t| t.0)
}

/// A status an injected error may carry: 500 to 599.
pub fn parse_status(text: &str) -> Result<u16, String> {
    match text.trim().parse::<u16>() {
        Ok(status @ 500..=599) => Ok(status),
        _ => Err(format!("`{text}` is not a 5xx status")),
    }
}

/// A scripted fault: the requests it applies to, and what happens to them. Every condition
/// it names must hold; a rule with none applies to every request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The `Idempotency-Key`, where `*` matches any run of characters.
    pub key: Option<String>,
    /// The request's number among its key's requests, from 1.
    pub nth: Option<u64>,
    /// The method, in upper case.
    pub method: Option<String>,
    pub fault: Fault,
}

impl Rule {
    /// A rule for every request of `key` numbered `nth`.
    pub fn for_key(key: &str, nth: u64, fault: Fault) -> Rule {
        Rule {
            key: Some(key.to_string()),
            nth: Some(nth),
            method: None,
            fault,
        }
    }

    /// Reads a rule: conditions `key=GLOB`, `nth=N`, `method=M`, in any order, and one fault
    /// (see [`Fault::parse`]), separated by spaces. `nth=1 drop`, `key=*:charge-* error=503`.
    pub fn parse(text: &str, default_delay: Duration, default_status: u16) -> Result<Rule, String> {
        let mut rule = Rule {
            key: None,
            nth: None,
            method: None,
            fault: Fault::Pass,
        };
        let mut fault = None;
        for word in text.split_whitespace() {
            match word.split_once('=') {
                Some(("key", glob)) if !glob.is_empty() => rule.key = Some(glob.to_string()),
                Some(("nth", n)) => match n.parse::<u64>() {
                    Ok(n) if n >= 1 => rule.nth = Some(n),
                    _ => return Err(format!("`nth={n}`: a request number counts from 1")),
                },
                Some(("method", m)) if !m.is_empty() => rule.method = Some(m.to_ascii_uppercase()),
                _ if fault.is_some() => {
                    return Err(format!(
                        "`{word}`: a rule has one fault, and it has one already"
                    ));
                }
                _ => fault = Some(Fault::parse(word, default_delay, default_status)?),
            }
        }
        rule.fault = fault.ok_or(
            "a rule names its fault: pass, drop, reset, delay, error, duplicate or malformed",
        )?;
        Ok(rule)
    }

    /// Whether this rule applies to a request.
    pub fn matches(&self, key: Option<&str>, nth: u64, method: &str) -> bool {
        let key_matches = match (&self.key, key) {
            (None, _) => true,
            (Some(glob), Some(key)) => glob_match(glob, key),
            (Some(_), None) => false,
        };
        key_matches
            && self.nth.is_none_or(|n| n == nth)
            && self
                .method
                .as_deref()
                .is_none_or(|m| m.eq_ignore_ascii_case(method))
    }
}

/// A script's rule that could not be read: its line, from 1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ScriptError {
    pub line: usize,
    pub message: String,
}

/// Reads a script: one rule per line, `#` starts a comment, blank lines are skipped.
pub fn parse_script(
    text: &str,
    default_delay: Duration,
    default_status: u16,
) -> Result<Vec<Rule>, ScriptError> {
    let mut rules = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let rule =
            Rule::parse(line, default_delay, default_status).map_err(|message| ScriptError {
                line: i + 1,
                message,
            })?;
        rules.push(rule);
    }
    Ok(rules)
}

/// How often each fault is drawn, each a probability from 0 to 1; their sum is at most 1, and
/// the rest of the requests pass.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Rates {
    pub drop: f64,
    pub reset: f64,
    pub delay: f64,
    pub error: f64,
    pub duplicate: f64,
    pub malformed: f64,
}

impl Rates {
    fn each(&self) -> [(&'static str, f64); 6] {
        [
            ("drop", self.drop),
            ("reset", self.reset),
            ("delay", self.delay),
            ("error", self.error),
            ("duplicate", self.duplicate),
            ("malformed", self.malformed),
        ]
    }

    /// Each rate within 0 and 1, and all of them together too; the error names the rate.
    pub fn check(&self) -> Result<(), String> {
        let mut sum = 0.0;
        for (name, rate) in self.each() {
            if !(0.0..=1.0).contains(&rate) {
                return Err(format!("the {name} rate must be between 0 and 1"));
            }
            sum += rate;
        }
        if sum > 1.0 + 1e-9 {
            return Err(format!(
                "the fault rates add up to {sum}, more than 1: lower some of them"
            ));
        }
        Ok(())
    }
}

/// Everything that decides a request's fault.
#[derive(Debug, Clone, PartialEq)]
pub struct Faults {
    pub seed: u64,
    pub rates: Rates,
    /// Scripted rules, first match wins, before any rate is drawn.
    pub rules: Vec<Rule>,
    /// How long a drawn `delay` holds a request.
    pub delay: Duration,
    /// The status a drawn `error` answers.
    pub error_status: u16,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            seed: 0,
            rates: Rates::default(),
            rules: Vec::new(),
            delay: Duration::from_secs(2),
            error_status: 502,
        }
    }
}

impl Faults {
    /// The fault of a request: the first rule that matches it, else a draw at the rates.
    pub fn decide(&self, key: Option<&str>, nth: u64, method: &str) -> Fault {
        if let Some(rule) = self.rules.iter().find(|r| r.matches(key, nth, method)) {
            return rule.fault;
        }
        let r = &self.rates;
        let drawn = [
            (r.drop, Fault::Drop),
            (r.reset, Fault::Reset),
            (r.delay, Fault::Delay(self.delay)),
            (r.error, Fault::Error(self.error_status)),
            (r.duplicate, Fault::Duplicate),
            (r.malformed, Fault::Malformed),
        ];
        let mut x = draw(self.seed, key.unwrap_or(""), nth);
        for (rate, fault) in drawn {
            if x < rate {
                return fault;
            }
            x -= rate;
        }
        Fault::Pass
    }
}

/// A uniform number in [0, 1) from the seed, the key and the request's number: FNV-1a over the
/// key, mixed with the others by SplitMix64's finaliser. Stable across platforms and releases,
/// so a seed written in a bug report replays.
fn draw(seed: u64, key: &str, nth: u64) -> f64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let x = mix(seed ^ mix(h ^ mix(nth)));
    (x >> 11) as f64 / (1u64 << 53) as f64
}

fn mix(z: u64) -> u64 {
    let mut z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `*` matches any run of characters (none included); every other character itself.
fn glob_match(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || text.len() < first.len() + last.len() || !text.ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(2);

    #[test]
    fn faults_read_as_written() {
        let parse = |t: &str| Fault::parse(t, D, 502);
        assert_eq!(parse("drop"), Ok(Fault::Drop));
        assert_eq!(parse("error"), Ok(Fault::Error(502)));
        assert_eq!(parse("error=503"), Ok(Fault::Error(503)));
        assert_eq!(parse("delay"), Ok(Fault::Delay(D)));
        assert_eq!(
            parse("delay=250ms"),
            Ok(Fault::Delay(Duration::from_millis(250)))
        );
        assert!(parse("error=404").unwrap_err().contains("5xx"));
        assert!(parse("drop=1").unwrap_err().contains("no value"));
        assert!(parse("explode").unwrap_err().contains("not a fault"));
        for fault in [
            Fault::Drop,
            Fault::Error(504),
            Fault::Delay(D),
            Fault::Malformed,
        ] {
            assert_eq!(parse(&fault.to_string()), Ok(fault));
        }
    }

    #[test]
    fn rules_match_key_number_and_method() {
        let rule = Rule::parse("key=acme:*:step-1 nth=2 method=post error=503", D, 502).unwrap();
        assert_eq!(rule.fault, Fault::Error(503));
        assert!(rule.matches(Some("acme:prod:step-1"), 2, "POST"));
        assert!(!rule.matches(Some("acme:prod:step-1"), 1, "POST"));
        assert!(!rule.matches(Some("acme:prod:step-2"), 2, "POST"));
        assert!(!rule.matches(Some("acme:prod:step-1"), 2, "GET"));
        assert!(!rule.matches(None, 2, "POST"));
        assert!(
            Rule::parse("nth=1", D, 502)
                .unwrap_err()
                .contains("names its fault")
        );
        assert!(
            Rule::parse("nth=0 drop", D, 502)
                .unwrap_err()
                .contains("from 1")
        );
        assert!(
            Rule::parse("drop reset", D, 502)
                .unwrap_err()
                .contains("one fault")
        );
        let script = parse_script(
            "# lose the first answer\nnth=1 drop\n\nnth=2 nope\n",
            D,
            502,
        );
        assert_eq!(script.unwrap_err().line, 4);
    }

    #[test]
    fn globs() {
        assert!(glob_match("a*c", "abc"));
        assert!(glob_match("a*c", "ac"));
        assert!(glob_match("*", ""));
        assert!(glob_match("*b*", "abc"));
        assert!(!glob_match("a*c", "ab"));
        assert!(!glob_match("a*b*c", "acb"));
        assert!(glob_match("exact", "exact"));
        assert!(!glob_match("aa*aa", "aaa"));
    }

    #[test]
    fn draws_depend_on_seed_key_and_number_only() {
        let faults = Faults {
            seed: 7,
            rates: Rates {
                drop: 0.3,
                error: 0.2,
                ..Rates::default()
            },
            ..Faults::default()
        };
        let run = |f: &Faults| {
            (1..=200)
                .map(|i| f.decide(Some(&format!("k{}", i % 20)), (i / 20) + 1, "POST"))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(&faults), run(&faults));
        let other = Faults {
            seed: 8,
            ..faults.clone()
        };
        assert_ne!(run(&faults), run(&other));
        let drops = run(&faults).iter().filter(|f| **f == Fault::Drop).count();
        let errors = run(&faults)
            .iter()
            .filter(|f| **f == Fault::Error(502))
            .count();
        // 200 draws at 30 % and 20 %: far inside these bounds unless the draw is broken.
        assert!((35..=85).contains(&drops), "{drops}");
        assert!((20..=65).contains(&errors), "{errors}");
    }

    #[test]
    fn rules_win_over_rates_and_rates_are_checked() {
        let faults = Faults {
            rates: Rates {
                drop: 1.0,
                ..Rates::default()
            },
            rules: vec![Rule::for_key("k", 1, Fault::Pass)],
            ..Faults::default()
        };
        assert_eq!(faults.decide(Some("k"), 1, "POST"), Fault::Pass);
        assert_eq!(faults.decide(Some("k"), 2, "POST"), Fault::Drop);
        let too_much = Rates {
            drop: 0.7,
            reset: 0.4,
            ..Rates::default()
        };
        assert!(too_much.check().unwrap_err().contains("more than 1"));
        let negative = Rates {
            delay: -0.1,
            ..Rates::default()
        };
        assert!(negative.check().unwrap_err().contains("delay rate"));
    }
}
