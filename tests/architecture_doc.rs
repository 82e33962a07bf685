//! `docs/architecture.md` is the map a new engineer reads first, so it must name only things that
//! exist: every file path it quotes is in the tree, and every function or type it quotes is
//! defined in the workspace — in the file it is quoted with, when a path stands right beside it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const DOC: &str = "docs/architecture.md";
/// Source folders the doc may point into (vendored crates are not ours to describe).
const SOURCE_ROOTS: &[&str] = &[
    "api-server",
    "engine-worker",
    "token-processor",
    "proto",
    "gguf",
    "vocab",
    "grammar",
    "tests",
];

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A `code span` of the doc and the text that comes before it since the previous span.
struct Span {
    text: String,
    gap_before: String,
}

/// Every `code span` of the doc, in order.
fn spans(doc: &str) -> Vec<Span> {
    let pieces: Vec<&str> = doc.split('`').collect();
    pieces
        .chunks(2)
        .filter(|pair| pair.len() == 2)
        .map(|pair| Span {
            gap_before: pair[0].to_owned(),
            text: pair[1].trim().to_owned(),
        })
        .collect()
}

fn code_spans(doc: &str) -> Vec<String> {
    spans(doc).into_iter().map(|s| s.text).collect()
}

fn is_path(span: &str) -> bool {
    span.contains('/')
        && !span.contains(' ')
        && [".rs", ".md", ".cu", ".sh", ".toml"]
            .iter()
            .any(|ext| span.ends_with(ext))
}

fn is_ident(word: &str) -> bool {
    let mut chars = word.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A quoted Rust item: `name`, `Type::item` or `Type::Variant`, ignoring call parentheses.
/// Option names, values and prose fragments are not items.
fn item_path(span: &str) -> Option<Vec<String>> {
    let span = span.strip_suffix("()").unwrap_or(span);
    let parts: Vec<String> = span.split("::").map(str::to_owned).collect();
    if parts.iter().all(|p| is_ident(p)) {
        Some(parts)
    } else {
        None
    }
}

fn is_snake_fn(name: &str) -> bool {
    name.contains('_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

fn is_type_name(name: &str) -> bool {
    name.chars().next().is_some_and(|c| c.is_ascii_uppercase())
        && name.chars().any(|c| c.is_ascii_lowercase())
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "target") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn defines(source: &str, name: &str) -> bool {
    [
        "fn ", "struct ", "enum ", "trait ", "type ", "const ", "static ", "mod ",
    ]
    .iter()
    .any(|kw| {
        source.match_indices(&format!("{kw}{name}")).any(|(at, _)| {
            let after = source[at + kw.len() + name.len()..].chars().next();
            !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        })
    })
}

/// A field (`name: T`) or an enum variant (`Name,`, `Name(..)`, `Name {..}`) at the start of a
/// line.
fn declares_member(source: &str, name: &str) -> bool {
    source.lines().any(|line| {
        let line = line.trim_start();
        let line = line.strip_prefix("pub ").unwrap_or(line);
        line.strip_prefix(name).is_some_and(|rest| {
            [":", ",", "(", " {", " ="]
                .iter()
                .any(|p| rest.starts_with(p))
        })
    })
}

/// `Type::Variant` or `Type::CONST`: the name appears as a word in the type's files.
fn mentions(source: &str, name: &str) -> bool {
    source.match_indices(name).any(|(at, _)| {
        let before = source[..at].chars().next_back();
        let after = source[at + name.len()..].chars().next();
        let is_word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        !is_word(before) && !is_word(after)
    })
}

struct Sources {
    files: Vec<(PathBuf, String)>,
}

impl Sources {
    fn load(root: &Path) -> Self {
        let mut paths = Vec::new();
        for dir in SOURCE_ROOTS {
            rust_files(&root.join(dir), &mut paths);
        }
        let files = paths
            .into_iter()
            .map(|p| {
                let text = std::fs::read_to_string(&p).unwrap();
                (p, text)
            })
            .collect();
        Self { files }
    }

    fn defining(&self, name: &str) -> impl Iterator<Item = &(PathBuf, String)> {
        let name = name.to_owned();
        self.files.iter().filter(move |(_, s)| defines(s, &name))
    }

    /// Whether the quoted item exists: its last segment is defined (a function, type, ...) or,
    /// for `Type::Variant`, named in a file that defines `Type`.
    fn has_item(&self, parts: &[String]) -> bool {
        let last = parts.last().unwrap();
        if parts.len() == 1 {
            return self.defining(last).next().is_some()
                || self.files.iter().any(|(_, s)| declares_member(s, last));
        }
        let owner = &parts[parts.len() - 2];
        let owner_files: Vec<_> = self.defining(owner).collect();
        if owner_files.is_empty() {
            // `module::item`: the item is defined somewhere.
            return self.defining(last).next().is_some();
        }
        let is_method = last
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        self.defining(last).next().is_some()
            || (!is_method && owner_files.iter().any(|(_, s)| mentions(s, last)))
    }
}

/// An item worth checking: a function (snake_case with an underscore, or `Type::method`) or a
/// type. Plain words such as `model` or `worker` are labels, not items.
fn is_checked_item(parts: &[String]) -> bool {
    let last = parts.last().unwrap();
    parts.len() > 1 || is_snake_fn(last) || is_type_name(last)
}

#[test]
fn every_path_the_architecture_doc_names_exists() {
    let root = repo_root();
    let doc = std::fs::read_to_string(root.join(DOC)).unwrap();
    let missing: BTreeSet<String> = code_spans(&doc)
        .into_iter()
        .filter(|span| is_path(span) && !span.starts_with("shared/"))
        .filter(|span| !root.join(span).exists())
        .collect();
    assert!(
        missing.is_empty(),
        "{DOC} names files that do not exist: {missing:?}"
    );
}

#[test]
fn every_function_and_type_the_architecture_doc_names_is_defined() {
    let root = repo_root();
    let doc = std::fs::read_to_string(root.join(DOC)).unwrap();
    let sources = Sources::load(&root);
    let missing: BTreeSet<String> = code_spans(&doc)
        .into_iter()
        .filter_map(|span| item_path(&span).map(|parts| (span, parts)))
        .filter(|(_, parts)| is_checked_item(parts))
        .filter(|(_, parts)| !sources.has_item(parts))
        .map(|(span, _)| span)
        .collect();
    assert!(
        missing.is_empty(),
        "{DOC} names items that are not defined: {missing:?}"
    );
}

/// A function quoted right beside its file — "`path` `function`" or "`function` (`path`" —
/// must be defined in that file.
#[test]
fn a_function_quoted_beside_its_file_is_defined_there() {
    let root = repo_root();
    let doc = std::fs::read_to_string(root.join(DOC)).unwrap();
    let spans = spans(&doc);
    let mut wrong = Vec::new();
    let mut checked = 0;
    for pair in spans.windows(2) {
        let (first, second) = (&pair[0], &pair[1]);
        let gap = second.gap_before.as_str();
        let (path, item) = if gap.trim().is_empty() {
            (&first.text, &second.text)
        } else if gap == " (" || gap == "\n    (" {
            (&second.text, &first.text)
        } else {
            continue;
        };
        if !path.ends_with(".rs") || !is_path(path) {
            continue;
        }
        let Some(parts) = item_path(item) else {
            continue;
        };
        let name = parts.last().unwrap();
        if !(is_snake_fn(name) || parts.len() > 1) {
            continue;
        }
        let Ok(source) = std::fs::read_to_string(root.join(path)) else {
            continue; // reported by the path test
        };
        checked += 1;
        let found = if is_snake_fn(name) {
            defines(&source, name)
        } else {
            defines(&source, name) || mentions(&source, name)
        };
        if !found {
            wrong.push(format!("{item} is not in {path}"));
        }
    }
    assert!(
        checked >= 10,
        "expected the doc to quote functions beside their files ({checked})"
    );
    assert!(wrong.is_empty(), "{DOC}: {wrong:#?}");
}

#[test]
fn the_checks_catch_a_name_that_does_not_exist() {
    let root = repo_root();
    let sources = Sources::load(&root);
    let parts = item_path("Engine::step_that_never_was").unwrap();
    assert!(is_checked_item(&parts));
    assert!(!sources.has_item(&parts));
    assert!(!sources.has_item(&item_path("Registry::dispatched").unwrap()));
    assert!(sources.has_item(&item_path("Engine::step").unwrap()));
    assert!(!root.join("engine-worker/src/engine/not_here.rs").exists());
}
