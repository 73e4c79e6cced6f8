//! Contract loading, one for every face (`serve`'s `contracts = [...]`, `idemgate mcp
//! --contracts`, `wrap`'s file, `consume`): patterns → files ([`expand`], [`files`]) →
//! checked contracts ([`load_files`], or both at once with [`load`]), and the embedded
//! examples ([`examples`]) that `idemgate serve` without configuration runs.

use std::path::{Path, PathBuf};

use idemgate_core::contract::{Contract, LoadError};

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

/// Why contracts could not be loaded. Each face words the first three its own way (`serve`
/// prefixes `contracts:`); the [`Display`](std::fmt::Display) here is `idemgate mcp`'s.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Glob(#[from] GlobError),
    #[error("no contract files match {0:?}")]
    NoMatch(Vec<String>),
    #[error("{path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Contract(#[from] LoadError),
}

/// Expands every pattern relative to `base`, in order; each pattern's files sorted.
pub fn files(patterns: &[String], base: &Path) -> Result<Vec<PathBuf>, GlobError> {
    let mut files = Vec::new();
    for pattern in patterns {
        files.extend(expand(pattern, base)?);
    }
    Ok(files)
}

/// Reads and checks contract files, named in errors as given.
pub fn load_files(files: &[PathBuf]) -> Result<Vec<Contract>, Error> {
    files
        .iter()
        .map(|path| {
            let shown = path.display().to_string();
            let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
                path: shown.clone(),
                source,
            })?;
            Ok(Contract::load(&text, &shown)?)
        })
        .collect()
}

/// The contracts the patterns name, relative to `base`: no matching file is an error.
pub fn load(patterns: &[String], base: &Path) -> Result<Vec<Contract>, Error> {
    let files = files(patterns, base)?;
    if files.is_empty() {
        return Err(Error::NoMatch(patterns.to_vec()));
    }
    load_files(&files)
}

/// The example contracts, embedded so that `idemgate serve` without configuration runs from
/// any directory.
pub const EXAMPLES: &[(&str, &str)] = &[
    (
        "tickets.create.yaml",
        include_str!("../../../contracts/tickets.create.yaml"),
    ),
    (
        "tickets.get.yaml",
        include_str!("../../../contracts/tickets.get.yaml"),
    ),
    (
        "tickets.set_status.yaml",
        include_str!("../../../contracts/tickets.set_status.yaml"),
    ),
    (
        "email.send.yaml",
        include_str!("../../../contracts/email.send.yaml"),
    ),
    (
        "reports.generate.yaml",
        include_str!("../../../contracts/reports.generate.yaml"),
    ),
];

/// Loads the embedded example contracts.
pub fn examples() -> Result<Vec<Contract>, LoadError> {
    EXAMPLES
        .iter()
        .map(|(file, text)| Contract::load(text, file))
        .collect()
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
    fn the_examples_load() {
        assert_eq!(examples().unwrap().len(), EXAMPLES.len());
    }

    #[test]
    fn load_needs_a_matching_file_and_names_the_file_it_cannot_read() {
        let dir = tempfile::tempdir().unwrap();
        let e = load(&["*.yaml".into()], dir.path()).unwrap_err();
        assert_eq!(e.to_string(), r#"no contract files match ["*.yaml"]"#);
        let (name, text) = EXAMPLES[0];
        std::fs::write(dir.path().join(name), text).unwrap();
        let loaded = load(&["*.yaml".into()], dir.path()).unwrap();
        assert_eq!(loaded[0].name, "tickets.create");
        let e = load(&["missing.yaml".into()], dir.path()).unwrap_err();
        assert!(
            matches!(&e, Error::Read { path, .. } if path.ends_with("missing.yaml")),
            "{e}"
        );
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
