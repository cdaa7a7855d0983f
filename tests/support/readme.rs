//! The README's runnable blocks. A fenced block whose info string is
//! `sh e2e` is a step of the walkthrough ("From nothing to a leader"): the
//! end-to-end suite runs them all, in order, as one bash script
//! ([`e2e_script`]) from the repository root against a real cluster. Such a
//! block may run only [`E2E_COMMANDS`] (the suite provides `helm` by
//! rendering charts/leasehold) and read only [`E2E_VARIABLES`]. A block
//! fenced `sh local` is the one-machine trial, run by tests/install/readme.rs.

#![allow(dead_code)] // the end-to-end suite uses e2e_script, tests/install/readme.rs the rest

/// The commands a walkthrough block may run.
pub const E2E_COMMANDS: &[&str] = &["kubectl", "helm"];
/// The variables a walkthrough block may read, set by whoever runs it.
pub const E2E_VARIABLES: &[&str] = &[];

/// One fenced block: its info string, text and the line it starts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub info: String,
    pub text: String,
    pub line: usize,
}

/// The fenced blocks of `markdown` whose info string is exactly `info`, in order.
pub fn blocks(markdown: &str, info: &str) -> Vec<Block> {
    let mut found = Vec::new();
    let mut open: Option<Block> = None;
    for (number, line) in markdown.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(opening)) => {
                open = Some(Block {
                    info: opening.trim().to_string(),
                    text: String::new(),
                    line: number + 1,
                })
            }
            (Some(_), Some("")) => found.extend(open.take().filter(|b| b.info == info)),
            (Some(block), _) => {
                block.text.push_str(line);
                block.text.push('\n');
            }
            (None, None) => {}
        }
    }
    found
}

/// The walkthrough as one script: every `sh e2e` block in order, stopping
/// at the first failing command.
pub fn e2e_script(readme: &str) -> String {
    let mut script = String::from("set -euo pipefail\n");
    for block in blocks(readme, "sh e2e") {
        script.push_str(&format!("# README.md line {}\n{}", block.line, block.text));
    }
    script
}

/// The simple commands of a script, continuation lines joined: the text
/// between `&&`, `||`, `;`, `|` and line ends, comments dropped.
pub fn commands(script: &str) -> Vec<String> {
    let joined = script.replace("\\\n", " ");
    let mut out = Vec::new();
    for line in joined.lines() {
        let line = line.split(" #").next().unwrap_or_default();
        if line.trim_start().starts_with('#') {
            continue;
        }
        for part in line
            .split("&&")
            .flat_map(|p| p.split("||"))
            .flat_map(|p| p.split([';', '|']))
        {
            let part = part.trim().trim_end_matches('&').trim();
            if !part.is_empty() {
                out.push(part.to_string());
            }
        }
    }
    out
}

/// The variables a script reads (`$NAME`, `${NAME}`).
pub fn variables(script: &str) -> Vec<String> {
    let mut out = Vec::new();
    for piece in script.split('$').skip(1) {
        let name: String = piece
            .trim_start_matches('{')
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() && !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

/// What in `script` the end-to-end suite cannot provide: commands beyond
/// [`E2E_COMMANDS`], variables beyond [`E2E_VARIABLES`].
pub fn unprovided(script: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for command in commands(script) {
        let program = command.split_whitespace().next().unwrap_or_default();
        if !E2E_COMMANDS.contains(&program) && !["set"].contains(&program) {
            problems.push(format!("command {program:?} ({command})"));
        }
    }
    for variable in variables(script) {
        if !E2E_VARIABLES.contains(&variable.as_str()) {
            problems.push(format!("variable ${variable}"));
        }
    }
    problems
}
