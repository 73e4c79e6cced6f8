//! Contract file patterns: one expansion for every face (`serve`'s `contracts = [...]`,
//! `idemgate mcp --contracts`, `wrap`'s file, `consume`).

use std::path::{Path, PathBuf};

/// A pattern that cannot be expanded, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{pattern}: {message}")]
pub struct GlobError {
    pub pattern: String,
    pub message: String,
}

/// Expands one pattern relative to `base` (an absolute pattern ignores it): a `*` may appear
/// in the last path segment only (`contracts/*.yaml`); a pattern without `*` names a file,
/// returned as it is. Matches are files, sorted, so tools list in a stable order; a directory
/// that cannot be read is an error naming the pattern.
pub fn expand(pattern: &str, base: &Path) -> Result<Vec<PathBuf>, GlobError> {
    let fail = |message: &str| GlobError {
        pattern: pattern.to_string(),
        message: message.to_string(),
    };
    let path = base.join(pattern);
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| fail("names no file"))?;
    if !name.contains('*') {
        if pattern.contains('*') {
            return Err(fail("`*` is only expanded in the last path segment"));
        }
        return Ok(vec![path]);
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if dir.to_string_lossy().contains('*') {
        return Err(fail("`*` is only expanded in the last path segment"));
    }
    let entries = std::fs::read_dir(&dir).map_err(|e| fail(&e.to_string()))?;
    let mut found: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter(|e| e.file_name().to_str().is_some_and(|n| wildcard(name, n)))
        .map(|e| e.path())
        .collect();
    found.sort();
    Ok(found)
}

/// `*` matches any run of characters; everything else matches itself.
pub fn wildcard(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if parts.len() == 1 {
        return pattern == text;
    }
    if !text.starts_with(first) || text.len() < first.len() + last.len() || !text.ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(at) => rest = &rest[at + middle.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_match_like_a_shell_in_one_segment() {
        for (pattern, text, expect) in [
            ("*.yaml", "tickets.create.yaml", true),
            ("*.yaml", "tickets.create.yml", false),
            ("tickets.*.yaml", "tickets.get.yaml", true),
            ("tickets.*.yaml", "email.send.yaml", false),
            ("*", "anything", true),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "acb", false),
            ("ab*ba", "aba", false),
            ("a*b", "ac", false),
            ("exact", "exact", true),
        ] {
            assert_eq!(wildcard(pattern, text), expect, "{pattern} ~ {text}");
        }
    }

    #[test]
    fn expand_lists_sorted_files_relative_to_the_base_and_refuses_stars_in_directories() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("contracts")).unwrap();
        for name in ["b.yaml", "a.yaml", "c.txt"] {
            std::fs::write(dir.path().join("contracts").join(name), "").unwrap();
        }
        let names = |found: Vec<PathBuf>| -> Vec<String> {
            found
                .iter()
                .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
                .collect()
        };
        let absolute = format!("{}/contracts/*.yaml", dir.path().display());
        assert_eq!(
            names(expand(&absolute, Path::new("/elsewhere")).unwrap()),
            ["a.yaml", "b.yaml"]
        );
        assert_eq!(
            names(expand("contracts/*.yaml", dir.path()).unwrap()),
            ["a.yaml", "b.yaml"]
        );
        let e = expand("contr*/x.yaml", dir.path()).unwrap_err();
        assert_eq!(e.message, "`*` is only expanded in the last path segment");
        let e = expand("missing/*.yaml", dir.path()).unwrap_err();
        assert_eq!(e.pattern, "missing/*.yaml");
    }
}
