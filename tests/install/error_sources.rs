//! Each cause is printed once (developers' guide: "a `#[source]` is not
//! also formatted into the message"). A thiserror type whose `#[error]`
//! message formats a field that is also its source (`#[source]`,
//! `#[from]`, or named `source`) shows that cause twice wherever the error
//! is printed with its chain (`leasehold::errors::chain`, `{:#}`): once in
//! the message, once as the cause. This reads every `#[error(...)]` under
//! `src/` and fails naming file:line of each such variant.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a readable folder") {
        let path = entry.expect("a folder entry").path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// The index just past the bracket that closes the one at `open`.
fn close_of(code: &[u8], open: usize) -> usize {
    let mut depth = 0usize;
    let mut i = open;
    let mut in_string = false;
    while i < code.len() {
        match code[i] {
            b'\\' if in_string => i += 1,
            b'"' => in_string = !in_string,
            b'(' | b'[' | b'{' if !in_string => depth += 1,
            b')' | b']' | b'}' if !in_string => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    code.len()
}

/// The fields `{name}`/`{0}` a format string names (`{{` is a brace).
fn placeholders(format: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = format;
    while let Some(at) = rest.find('{') {
        rest = &rest[at + 1..];
        if let Some(after) = rest.strip_prefix('{') {
            rest = after;
            continue;
        }
        let end = rest.find(['}', ':', '.']).unwrap_or(rest.len());
        names.push(rest[..end].trim().to_string());
    }
    names
}

/// Splits `a, b<c, d>, e` at its top-level commas.
fn fields(body: &str) -> Vec<String> {
    let (mut parts, mut depth, mut current) = (Vec::new(), 0i32, String::new());
    for c in body.chars() {
        match c {
            '(' | '[' | '{' | '<' => depth += 1,
            ')' | ']' | '}' | '>' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    parts.push(current);
    parts.into_iter().filter(|p| !p.trim().is_empty()).collect()
}

/// The names (`0`, `1`, … for a tuple) of the fields thiserror takes as the source.
fn source_fields(kind: u8, body: &str) -> Vec<String> {
    fields(body)
        .iter()
        .enumerate()
        .filter_map(|(index, field)| {
            let marked = field.contains("#[source]") || field.contains("#[from]");
            if kind == b'(' {
                return marked.then(|| index.to_string());
            }
            // `#[attr] pub name: Type`: the name is the last word before the first top-level ':'.
            let without_attrs: String = field
                .lines()
                .map(|l| l.trim())
                .filter(|l| !l.starts_with("#[") && !l.starts_with("//"))
                .collect::<Vec<_>>()
                .join(" ");
            let name = without_attrs.split(':').next()?.split_whitespace().last()?.to_string();
            (marked || name == "source").then_some(name)
        })
        .collect()
}

/// `file:line: what` for every variant (or struct) that formats its source.
fn sources_formatted(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("a readable source file");
        let code = text.as_bytes();
        let mut from = 0;
        while let Some(at) = text[from..].find("#[error(").map(|i| i + from) {
            from = at + 1;
            let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
            if text[line_start..at].contains("//") {
                continue;
            }
            let attribute_end = close_of(code, at + 1);
            let inside = &text[at + "#[error(".len()..attribute_end - 2];
            if inside.trim_start().starts_with("transparent") {
                continue;
            }
            // The literal (with its escapes left in: enough to find `{…}`),
            // then any extra format arguments (`.0`, `.source`).
            let Some(open) = inside.find('"') else { continue };
            let mut end = open + 1;
            let bytes = inside.as_bytes();
            while end < bytes.len() && bytes[end] != b'"' {
                end += if bytes[end] == b'\\' { 2 } else { 1 };
            }
            let format = &inside[open + 1..end.min(inside.len())];
            let extra = inside.get(end + 1..).unwrap_or("");

            // The item the attribute is on: skip attributes, comments and
            // keywords up to its name, then its fields.
            let mut i = attribute_end;
            let name = loop {
                while i < code.len() && code[i].is_ascii_whitespace() {
                    i += 1;
                }
                if text[i..].starts_with("#[") {
                    i = close_of(code, i + 1);
                } else if text[i..].starts_with("//") {
                    i += text[i..].find('\n').unwrap_or(text.len() - i);
                } else {
                    let word_end = text[i..]
                        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                        .map_or(text.len(), |e| e + i);
                    let word = &text[i..word_end];
                    i = word_end;
                    if text[i..].starts_with('(') && word == "pub" {
                        i = close_of(code, i);
                    } else if !matches!(word, "pub" | "struct" | "enum") {
                        break word.to_string();
                    }
                }
            };
            let mut j = i;
            while j < code.len() && code[j].is_ascii_whitespace() {
                j += 1;
            }
            if j >= code.len() || !matches!(code[j], b'(' | b'{') {
                continue;
            }
            let body = &text[j + 1..close_of(code, j) - 1];
            let named = placeholders(format);
            for source in source_fields(code[j], body) {
                let in_extra = extra
                    .match_indices(&format!(".{source}"))
                    .any(|(k, m)| !extra[k + m.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '_'));
                if named.contains(&source) || in_extra {
                    let line = text[..at].matches('\n').count() + 1;
                    let file = file.strip_prefix(src).unwrap_or(&file).display();
                    found.push(format!(
                        "{file}:{line}: {name} formats its source `{source}` in its message; \
                         the chain prints it again (drop it from the message, or use #[error(transparent)])"
                    ));
                }
            }
        }
    }
    found
}

#[test]
fn no_error_message_repeats_its_source() {
    let found: Vec<String> = super::crate_sources()
        .iter()
        .flat_map(|src| sources_formatted(src))
        .collect();
    assert!(
        found.is_empty(),
        "errors that print a cause twice:\n{}",
        found.join("\n")
    );
}

/// The check finds planted instances of every form (tuple `{0}` with
/// `#[from]`, a field named `source`, a `#[source]` under another name, an
/// extra argument `.0`, a struct error) and leaves alone a message that
/// formats a plain field, a source it does not name, and `transparent`.
#[test]
fn the_check_finds_planted_repeated_sources() {
    let src = std::env::temp_dir().join(format!("leasehold-error-sources-{:08x}", std::process::id()));
    std::fs::create_dir_all(src.join("m")).unwrap();
    std::fs::write(
        src.join("m/planted.rs"),
        r#"#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// fine: a plain field
    #[error("bad name {0:?}")]
    Name(String),
    #[error("spec.{0}")]
    Timing(#[from] TimingError),
    #[error("reading {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("listening on {addr}: {cause:?}")]
    Listen {
        addr: String,
        #[source]
        cause: std::io::Error,
    },
    // fine: the source is not in the message
    #[error("cannot list {what}")]
    List {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Other(#[from] OtherError),
    #[error("{}", .0)]
    Extra(#[source] std::io::Error),
}

#[derive(Debug, thiserror::Error)]
#[error("config: {0}")]
pub struct ConfigError(#[source] kube::Error);
"#,
    )
    .unwrap();
    let found = sources_formatted(&src);
    std::fs::remove_dir_all(&src).unwrap();
    let places: Vec<&str> = found.iter().map(|f| f.split(": ").next().unwrap()).collect();
    assert_eq!(
        places,
        [
            "m/planted.rs:6",
            "m/planted.rs:8",
            "m/planted.rs:10",
            "m/planted.rs:25",
            "m/planted.rs:30"
        ],
        "{found:#?}"
    );
    assert!(found[0].contains("Timing formats its source `0`"), "{}", found[0]);
    assert!(found[4].contains("ConfigError formats its source `0`"), "{}", found[4]);
}
