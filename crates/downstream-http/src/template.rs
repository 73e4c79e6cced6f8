//! URL templates: `http://host/tickets/{ticket_id}?key={operation_key}`.
//!
//! Placeholders may appear only after the authority: an argument chosen by a model must never
//! pick the host a request goes to. Every value is percent-encoded as one path segment (only
//! RFC 3986's unreserved characters stay as they are), so a value cannot add a `/`, `?` or `#`
//! and walk the request to another resource.

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

    /// Fills the placeholders with `value(name)`, percent-encoded.
    pub(crate) fn fill(
        &self,
        value: impl Fn(&str) -> Result<String, FillError>,
    ) -> Result<String, FillError> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Literal(text) => out.push_str(text),
                Part::Placeholder(name) => {
                    out.extend(utf8_percent_encode(&value(name)?, COMPONENT));
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(template: &str, value: &str) -> Result<String, String> {
        let t = Template::parse(template).map_err(|TemplateError::Syntax(m)| m)?;
        t.fill(|_| Ok(value.to_string())).map_err(|FillError(m)| m)
    }

    #[test]
    fn placeholders_are_filled_percent_encoded() {
        let ok = |t: &str, v: &str, expect: &str| assert_eq!(fill(t, v).as_deref(), Ok(expect));
        ok("http://h/t/{id}", "ticket_1", "http://h/t/ticket_1");
        ok("http://h/t/{id}", "a/../b", "http://h/t/a%2F..%2Fb");
        ok("http://h/t/{id}", "a?b#c", "http://h/t/a%3Fb%23c");
        ok(
            "http://h/k/{operation_key}",
            "t:e:w:s",
            "http://h/k/t%3Ae%3Aw%3As",
        );
        ok(
            "https://h:8443/x?k={k}",
            "é ~",
            "https://h:8443/x?k=%C3%A9%20~",
        );
        ok("http://h/plain", "unused", "http://h/plain");
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
