//! URL templates: `http://host/tickets/{ticket_id}?key={operation_key}`.
//!
//! Placeholders may appear only after the authority: an argument chosen by a model must never
//! pick the host a request goes to. Every value is percent-encoded as one path segment (only
//! RFC 3986's unreserved characters stay as they are), so a value cannot add a `/`, `?` or `#`
//! and walk the request to another resource.
//!
//! Encoding alone does not stop a value from moving the path: `.` is unreserved, so a value
//! `..` in `/accounts/{account}/tickets` would make the dot segment that URL parsers resolve
//! away, sending the request to `/tickets`; a value `.` or the empty string would make a
//! segment that parsers drop or servers merge with its neighbour. A path segment that holds a
//! placeholder is therefore refused when, filled, it is empty, `.` or `..` — the only dot
//! segments an encoded value can produce, since its `%` is itself encoded. In the query a
//! value cannot move the path, so there every value is taken, the empty string included:
//! whether an argument may be empty is the input schema's business, not the URL's.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// Everything but RFC 3986's unreserved characters `A-Z a-z 0-9 - . _ ~`.
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    Placeholder(String),
}

/// A parsed URL template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Template {
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TemplateError {
    Syntax(String),
}

/// A placeholder could not be filled: the message names it and never carries its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FillError(pub String);

impl Template {
    pub(crate) fn parse(text: &str) -> Result<Template, TemplateError> {
        let syntax = |m: String| TemplateError::Syntax(m);
        let rest = text
            .strip_prefix("http://")
            .or_else(|| text.strip_prefix("https://"))
            .ok_or_else(|| syntax(format!("`{text}` is not an http:// or https:// URL")))?;
        let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
        if authority.is_empty() {
            return Err(syntax(format!("`{text}` has no host")));
        }
        if authority.contains(['{', '}']) {
            return Err(syntax(
                "placeholders may not appear in the scheme, host or port: an argument must never choose where a request goes".into(),
            ));
        }
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut chars = text.chars();
        while let Some(c) = chars.next() {
            match c {
                '{' => {
                    let mut name = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some(c) if c.is_ascii_alphanumeric() || c == '_' || c == '-' => {
                                name.push(c)
                            }
                            _ => {
                                return Err(syntax(format!(
                                    "unterminated or malformed placeholder after `{{{name}` in `{text}`"
                                )));
                            }
                        }
                    }
                    if name.is_empty() {
                        return Err(syntax(format!("empty placeholder `{{}}` in `{text}`")));
                    }
                    if !literal.is_empty() {
                        parts.push(Part::Literal(std::mem::take(&mut literal)));
                    }
                    parts.push(Part::Placeholder(name));
                }
                '}' => return Err(syntax(format!("unmatched `}}` in `{text}`"))),
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        let template = Template { parts };
        // Filled with harmless values, the template must be a URL reqwest accepts.
        let sample = template
            .fill(|_| Ok("x".into()))
            .map_err(|FillError(m)| syntax(m))?;
        reqwest::Url::parse(&sample).map_err(|e| syntax(format!("`{text}` is not a URL: {e}")))?;
        Ok(template)
    }

    /// The names of the placeholders, in order.
    pub(crate) fn placeholders(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::Placeholder(name) => Some(name.as_str()),
            Part::Literal(_) => None,
        })
    }

    /// The text of a template without placeholders.
    pub(crate) fn literal(&self) -> Option<&str> {
        match self.parts.as_slice() {
            [Part::Literal(text)] => Some(text),
            _ => None,
        }
    }

    /// Fills the placeholders with `value(name)`, percent-encoded, and refuses a fill that
    /// would move the path (see the module's documentation).
    pub(crate) fn fill(
        &self,
        value: impl Fn(&str) -> Result<String, FillError>,
    ) -> Result<String, FillError> {
        let mut out = String::new();
        // The path segment being written: where it starts in `out` and the placeholders in it.
        // `None` once the query (or fragment) has begun.
        let mut segment: Option<(usize, Vec<&str>)> = Some((0, Vec::new()));
        for part in &self.parts {
            match part {
                Part::Literal(text) => {
                    for c in text.chars() {
                        if let (Some((start, names)), '/' | '?' | '#') = (&segment, c) {
                            still_in_place(&out[*start..], names)?;
                            segment = (c == '/').then(|| (out.len() + 1, Vec::new()));
                        }
                        out.push(c);
                    }
                }
                Part::Placeholder(name) => {
                    out.extend(utf8_percent_encode(&value(name)?, COMPONENT));
                    if let Some((_, names)) = &mut segment {
                        names.push(name);
                    }
                }
            }
        }
        if let Some((start, names)) = &segment {
            still_in_place(&out[*start..], names)?;
        }
        Ok(out)
    }
}

/// A filled path segment that holds placeholders must stay a segment of its own: not empty,
/// not a dot segment. Segments written by the template alone are the contract's business.
fn still_in_place(segment: &str, placeholders: &[&str]) -> Result<(), FillError> {
    if placeholders.is_empty() || !matches!(segment, "" | "." | "..") {
        return Ok(());
    }
    let names: Vec<String> = placeholders.iter().map(|n| format!("`{n}`")).collect();
    let (who, fill) = match names.len() {
        1 => ("argument", "fills"),
        _ => ("arguments", "fill"),
    };
    Err(FillError(format!(
        "{who} {} {fill} a segment of the downstream URL's path, which may not be empty, `.` or `..`: that would move the request to another path",
        names.join(" and ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use percent_encoding::percent_decode_str;

    fn fill(template: &str, value: &str) -> Result<String, String> {
        let t = Template::parse(template).map_err(|TemplateError::Syntax(m)| m)?;
        t.fill(|_| Ok(value.to_string())).map_err(|FillError(m)| m)
    }

    fn decode(text: &str) -> String {
        percent_decode_str(text).decode_utf8().unwrap().into_owned()
    }

    /// Fills every placeholder of `template` with `value`. `expect` is the filled URL, or the
    /// placeholders the refusal names. A filled URL is also read back by the URL parser
    /// reqwest sends with: its path has the template's segments, literal segments unchanged
    /// and each placeholder segment decoding to the value, and each `name={placeholder}`
    /// query parameter decodes to the value.
    fn check(template: &str, value: &str, expect: Result<&str, &str>) {
        let filled = fill(template, value);
        let url = match (filled, expect) {
            (Ok(url), Ok(expected)) => {
                assert_eq!(url, expected, "{template} with {value:?}");
                url
            }
            (Err(m), Err(names)) => {
                let named = format!("{names} fill");
                assert!(m.contains(&named), "{template} with {value:?}: {m}");
                assert!(m.contains("may not be empty, `.` or `..`"), "{m}");
                return;
            }
            (got, expected) => {
                panic!("{template} with {value:?}: got {got:?}, expected {expected:?}")
            }
        };
        let parsed = reqwest::Url::parse(&url).unwrap();
        let after_authority = template.split_once("://").unwrap().1;
        let rest = &after_authority[after_authority.find('/').unwrap_or(after_authority.len())..];
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let path = path.split('#').next().unwrap();
        let expected: Vec<&str> = path.strip_prefix('/').unwrap_or(path).split('/').collect();
        let segments: Vec<&str> = parsed.path_segments().unwrap().collect();
        assert_eq!(segments.len(), expected.len(), "{url}: {segments:?}");
        for (got, wanted) in segments.iter().zip(&expected) {
            if !wanted.contains('{') {
                assert_eq!(got, wanted, "{url}: a literal segment changed");
            } else if wanted.starts_with('{') && wanted.ends_with('}') {
                assert_eq!(decode(got), value, "{url}: a placeholder segment");
            }
        }
        let pairs: Vec<(String, String)> = parsed.query_pairs().into_owned().collect();
        for wanted in query.split('&').filter(|p| !p.is_empty()) {
            let (name, placeholder) = wanted.split_once('=').unwrap();
            let got = pairs
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str());
            if placeholder.starts_with('{') {
                assert_eq!(got, Some(value), "{url}: query parameter `{name}`");
            }
        }
    }

    const ACCOUNT: &str = "http://h/accounts/{account}/tickets?after={cursor}";

    #[test]
    #[rustfmt::skip]
    fn placeholders_are_filled_percent_encoded_and_keep_the_path() {
        check(ACCOUNT, "acct_1", Ok("http://h/accounts/acct_1/tickets?after=acct_1"));
        check(ACCOUNT, "a-b.c_d~e", Ok("http://h/accounts/a-b.c_d~e/tickets?after=a-b.c_d~e"));
        check(ACCOUNT, "...", Ok("http://h/accounts/.../tickets?after=..."));
        check(ACCOUNT, ".x", Ok("http://h/accounts/.x/tickets?after=.x"));
        // Separators and encoded dots stay inside the one segment.
        check(ACCOUNT, "a/..", Ok("http://h/accounts/a%2F../tickets?after=a%2F.."));
        check(ACCOUNT, "./x", Ok("http://h/accounts/.%2Fx/tickets?after=.%2Fx"));
        check(ACCOUNT, "../../admin", Ok("http://h/accounts/..%2F..%2Fadmin/tickets?after=..%2F..%2Fadmin"));
        check(ACCOUNT, "%2e%2e", Ok("http://h/accounts/%252e%252e/tickets?after=%252e%252e"));
        check(ACCOUNT, "%2E.", Ok("http://h/accounts/%252E./tickets?after=%252E."));
        check(ACCOUNT, "..\\", Ok("http://h/accounts/..%5C/tickets?after=..%5C"));
        check(ACCOUNT, "\\..", Ok("http://h/accounts/%5C../tickets?after=%5C.."));
        check(ACCOUNT, "..;", Ok("http://h/accounts/..%3B/tickets?after=..%3B"));
        check(ACCOUNT, ". ", Ok("http://h/accounts/.%20/tickets?after=.%20"));
        check(ACCOUNT, "a?b#c&d=e", Ok("http://h/accounts/a%3Fb%23c%26d%3De/tickets?after=a%3Fb%23c%26d%3De"));
        check(ACCOUNT, "é ~", Ok("http://h/accounts/%C3%A9%20~/tickets?after=%C3%A9%20~"));
        check(ACCOUNT, "日本", Ok("http://h/accounts/%E6%97%A5%E6%9C%AC/tickets?after=%E6%97%A5%E6%9C%AC"));
        check(ACCOUNT, "\u{1f4a5}", Ok("http://h/accounts/%F0%9F%92%A5/tickets?after=%F0%9F%92%A5"));
        check("http://h/k/{operation_key}", "t:e:w:s", Ok("http://h/k/t%3Ae%3Aw%3As"));
        check("https://h:8443/x?k={k}", "é ~", Ok("https://h:8443/x?k=%C3%A9%20~"));
        check("http://h/plain", "unused", Ok("http://h/plain"));
        // A value that would move the path is refused, naming the placeholder, not the value.
        check(ACCOUNT, "..", Err("argument `account`"));
        check(ACCOUNT, ".", Err("argument `account`"));
        check(ACCOUNT, "", Err("argument `account`"));
        check("http://h/t/{id}", "..", Err("argument `id`"));
        check("http://h/t/{id}/", "", Err("argument `id`"));
        // The whole segment decides: parts that make a dot segment together are refused too,
        // and a value beside a literal cannot make one.
        check("http://h/v/{a}{b}", ".", Err("arguments `a` and `b`"));
        check("http://h/v/{a}{b}", "", Err("arguments `a` and `b`"));
        check("http://h/files/{name}.json", "", Ok("http://h/files/.json"));
        check("http://h/files/{name}.json", ".", Ok("http://h/files/..json"));
        check("http://h/files/v{n}", "", Ok("http://h/files/v"));
        // In the query or the fragment no value moves the path; the empty string is taken.
        check("http://h/search?q={q}", "", Ok("http://h/search?q="));
        check("http://h/search?q={q}", "..", Ok("http://h/search?q=.."));
        check("http://h/search?q={q}", ".", Ok("http://h/search?q=."));
        check("http://h/page#{anchor}", "..", Ok("http://h/page#.."));
    }

    #[test]
    fn a_raw_dot_segment_would_move_the_path() {
        // Why the refusal exists: the parser reqwest uses resolves dot segments, encoded or
        // not, and the templates above would otherwise have produced these.
        let moved = |url: &str| reqwest::Url::parse(url).unwrap().path().to_string();
        assert_eq!(moved("http://h/accounts/../tickets"), "/tickets");
        assert_eq!(moved("http://h/accounts/%2e%2e/tickets"), "/tickets");
        assert_eq!(moved("http://h/accounts/./tickets"), "/accounts/tickets");
    }
    #[test]
    fn malformed_templates_are_refused_with_a_reason() {
        let bad = |t: &str, needle: &str| {
            let m = fill(t, "x").unwrap_err();
            assert!(m.contains(needle), "{t}: {m}");
        };
        bad("ftp://h/x", "http:// or https://");
        bad("http:///x", "no host");
        bad("http://{host}/x", "never choose where");
        bad("http://h:{port}/x", "never choose where");
        bad("http://h/{a", "unterminated");
        bad("http://h/{a b}", "malformed");
        bad("http://h/{}", "empty placeholder");
        bad("http://h/a}", "unmatched");
    }
}
