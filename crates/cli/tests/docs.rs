//! ARCHITECTURE.md stays true: at most 350 lines, every repository path it names exists, and
//! every test it cites is a `fn` (Rust) or `def` (Python) under `crates/` or `clients/`.
//!
//! The convention it is read by is stated at the top of the page: paths in backticks from the
//! repository root (`crates/…`, `docs/…`, …) or, for a crate's file, from `crates/`
//! (`server/tests/router.rs`); a path holding `*`, `<` or `…` is a pattern; after `Tests:` (or
//! `Test:`), to the end of its bullet or paragraph, each span in backticks is a test name
//! (`module::name` checked by its last part) or a path, and nothing else.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 350;

/// Top-level folders a path may start with.
const ROOTS: &[&str] = &[
    "crates/",
    "clients/",
    "docs/",
    "scripts/",
    "contracts/",
    "examples/",
    "fuzz/",
    ".ci/",
    ".config/",
];

/// Endings that make a span a file name, so one that resolves nowhere is a stale path rather
/// than something else with a slash in it (`tools/call`, `io.idemgate/operation`).
const FILE_ENDINGS: &[&str] = &[
    ".rs", ".py", ".md", ".toml", ".sql", ".yaml", ".yml", ".ts", ".json", ".sh", ".html",
];

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root")
}

/// What a span in backticks is, read by the page's convention.
#[derive(Debug, PartialEq)]
enum Span {
    /// A repository path, resolved against the root.
    Path(PathBuf),
    /// A pattern (`*`, `<…>`, `…`), not checked.
    Pattern,
    /// A span with a slash that names no file (`tools/call`), or no slash at all.
    Other,
    /// A span that names a file but under no known folder.
    Unplaced,
}

/// `home` is the folder of a crate's README, whose own files it names from there (`src/…`).
fn classify(root: &Path, home: Option<&Path>, span: &str) -> Span {
    if !span.contains('/') || span.starts_with('/') || span.contains(char::is_whitespace) {
        return Span::Other;
    }
    if span.contains(['*', '<', '…', '{']) {
        return Span::Pattern;
    }
    if ROOTS.iter().any(|r| span.starts_with(r)) {
        return Span::Path(root.join(span));
    }
    let first = span.split('/').next().unwrap_or_default();
    if let Some(home) = home
        && !first.is_empty()
        && home.join(first).exists()
    {
        return Span::Path(home.join(span));
    }
    if !first.is_empty() && root.join("crates").join(first).is_dir() {
        return Span::Path(root.join("crates").join(span));
    }
    if FILE_ENDINGS.iter().any(|e| span.ends_with(e)) {
        return Span::Unplaced;
    }
    Span::Other
}

/// The page's lines outside fenced code blocks, with their numbers.
fn prose(page: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in page.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// A line split into text and code, alternately (text first); `None` if a span is unclosed.
fn segments(line: &str) -> Option<Vec<&str>> {
    let parts: Vec<&str> = line.split('`').collect();
    (parts.len() % 2 == 1).then_some(parts)
}

/// Where "Tests:" or "Test:" starts in a text segment, as a word.
fn tests_marker(text: &str) -> bool {
    ["Tests:", "Test:"].iter().any(|m| {
        text.match_indices(m).any(|(i, _)| {
            !text[..i]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
    })
}

fn is_name(span: &str) -> bool {
    !span.is_empty()
        && span.split("::").all(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

/// Every name defined by `fn NAME` or `def NAME` in the Rust and Python files under `dirs`.
fn definitions(root: &Path, dirs: &[&str]) -> HashSet<String> {
    const SKIP: &[&str] = &[
        "target",
        "node_modules",
        ".venv",
        "venv",
        "dist",
        "build",
        "__pycache__",
        ".git",
    ];
    let mut names = HashSet::new();
    let mut stack: Vec<PathBuf> = dirs.iter().map(|d| root.join(d)).collect();
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if path.is_dir() {
                if !SKIP.contains(&name.as_ref()) {
                    stack.push(path);
                }
            } else if (name.ends_with(".rs") || name.ends_with(".py"))
                && let Ok(text) = fs::read_to_string(&path)
            {
                collect_definitions(&text, &mut names);
            }
        }
    }
    names
}

fn collect_definitions(text: &str, names: &mut HashSet<String>) {
    for keyword in ["fn ", "def "] {
        for (i, _) in text.match_indices(keyword) {
            let before = text[..i].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let rest = text[i + keyword.len()..].trim_start();
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                names.insert(name);
            }
        }
    }
}

fn too_long(page: &str) -> Option<String> {
    let lines = page.lines().count();
    (lines > MAX_LINES).then(|| format!("{lines} lines, more than {MAX_LINES}"))
}

/// Every way `page` breaks the convention or names something that does not exist.
fn faults(root: &Path, home: Option<&Path>, page: &str, defined: &HashSet<String>) -> Vec<String> {
    let mut faults = Vec::new();
    // A unit is a bullet or a paragraph; a "Tests:" clause runs to the end of its unit.
    let mut in_tests = false;
    for (n, line) in prose(page) {
        let trimmed = line.trim_start();
        let starts_unit = trimmed.is_empty()
            || trimmed.starts_with("- ")
            || trimmed.starts_with('#')
            || trimmed
                .split_once(". ")
                .is_some_and(|(d, _)| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()));
        if starts_unit {
            in_tests = false;
        }
        let Some(parts) = segments(line) else {
            faults.push(format!(
                "line {n}: a span in backticks is not closed on its line"
            ));
            continue;
        };
        for (i, part) in parts.iter().enumerate() {
            if i % 2 == 0 {
                if tests_marker(part) {
                    in_tests = true;
                }
                continue;
            }
            let span = *part;
            match classify(root, home, span) {
                Span::Path(path) => {
                    if !path.exists() {
                        faults.push(format!("line {n}: `{span}` does not exist"));
                    }
                }
                Span::Unplaced => faults.push(format!(
                    "line {n}: `{span}` names a file but starts neither with a top-level \
                     folder nor with a crate's folder"
                )),
                Span::Pattern => {}
                Span::Other if in_tests => {
                    if !is_name(span) {
                        faults.push(format!(
                            "line {n}: `{span}` after `Tests:` is neither a test name nor a path"
                        ));
                    } else {
                        let last = span.rsplit("::").next().unwrap_or(span);
                        if !defined.contains(last) {
                            faults.push(format!(
                                "line {n}: test `{span}` is no `fn` or `def` under crates/ or \
                                 clients/"
                            ));
                        }
                    }
                }
                Span::Other => {}
            }
        }
    }
    faults
}

#[test]
fn architecture_names_only_paths_and_tests_that_exist() {
    let root = repository();
    let page = fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let defined = definitions(&root, &["crates", "clients"]);
    let mut faults = faults(&root, None, &page, &defined);
    faults.extend(too_long(&page));
    assert!(
        faults.is_empty(),
        "ARCHITECTURE.md (see its conventions at the top):\n{}",
        faults.join("\n")
    );
}

/// The crates' READMEs, where ARCHITECTURE.md sends a reader for each crate's inside, are held
/// to the same convention; a path may also start in the crate's own folder (`src/writer.rs`).
#[test]
fn crate_readmes_name_only_paths_and_tests_that_exist() {
    let root = repository();
    let defined = definitions(&root, &["crates", "clients"]);
    let mut all = Vec::new();
    let mut read = 0;
    for entry in fs::read_dir(root.join("crates"))
        .expect("crates/")
        .flatten()
    {
        let home = entry.path();
        let Ok(page) = fs::read_to_string(home.join("README.md")) else {
            continue;
        };
        read += 1;
        let name = entry.file_name().to_string_lossy().into_owned();
        all.extend(
            faults(&root, Some(&home), &page, &defined)
                .into_iter()
                .map(|f| format!("crates/{name}/README.md {f}")),
        );
    }
    assert!(read > 0, "no crate README was read");
    assert!(all.is_empty(), "{}", all.join("\n"));
}

/// The checker itself reports each kind of fault, and passes what is right, on a small page
/// resolved against the real repository.
#[test]
fn the_checker_reports_every_stale_path_and_test() {
    let root = repository();
    let defined: HashSet<String> = ["a_test_that_exists"].map(String::from).into();
    let page = "\
# Title

Paths: `crates/core`, `server/tests/router.rs`, `cli/tests/crash.rs`, `docs/nowhere.md`,
`tools/call`, `crates/<crate>/README.md`, `lib/x.rs`.

- A rule. Tests: `a_test_that_exists`, `mod::a_test_that_exists`, `a_test_that_was_renamed`,
  `server/tests/router.rs`, `Outcome::new()`.
- Another rule, `not_a_test_here` outside a clause.

```
crates/gone/   a code block is not read
```
";
    let faults = faults(&root, None, page, &defined);
    let expected = [
        "line 3: `cli/tests/crash.rs` does not exist",
        "line 3: `docs/nowhere.md` does not exist",
        "line 4: `lib/x.rs` names a file",
        "line 6: test `a_test_that_was_renamed` is no `fn`",
        "line 7: `Outcome::new()` after `Tests:` is neither",
    ];
    for e in expected {
        assert!(
            faults.iter().any(|f| f.starts_with(e)),
            "missing {e:?} in {faults:#?}"
        );
    }
    assert_eq!(faults.len(), expected.len(), "{faults:#?}");

    let long = "line\n".repeat(MAX_LINES + 1);
    assert_eq!(
        too_long(&long),
        Some(format!("{} lines, more than {MAX_LINES}", MAX_LINES + 1))
    );
    assert_eq!(too_long(&"line\n".repeat(MAX_LINES)), None);
    // From a crate's README, its own files are named from its folder.
    let home = root.join("crates/server");
    assert_eq!(
        self::faults(
            &root,
            Some(&home),
            "`tests/router.rs`, `src/nowhere.rs`, `core/README.md`",
            &defined
        ),
        ["line 1: `src/nowhere.rs` does not exist"]
    );
    let mut names = HashSet::new();
    collect_definitions(
        "fn a() {}\npub async fn b_c<T>() {}\n    def d(self):\nlet xfn e = 1; undef f",
        &mut names,
    );
    assert_eq!(
        names,
        ["a", "b_c", "d"].map(String::from).into(),
        "only `fn` and `def` as words define a name"
    );
}
