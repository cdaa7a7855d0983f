//! The docs cannot fall out of step with the code: `docs/reference.md` is
//! generated from it (every DistributedLease field with its description,
//! every metric, every Event reason, every command's flags and environment
//! variables) and must equal what the code generates now; the hand-written
//! docs must name every Event reason, every metric and every spec and status
//! field. Regenerate with `LEASEHOLD_BLESS=1 cargo nextest run --test suite install::docs_reference`.

use std::collections::BTreeSet;
use std::path::Path;

use clap::CommandFactory;
use kube::CustomResourceExt;
use leasehold::api::DistributedLease;
use serde_json::Value;

const REFERENCE: &str = "docs/reference.md";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// (path, type, description) of every field under `schema`, depth first.
fn fields(prefix: &str, schema: &Value, out: &mut Vec<(String, String, String)>) {
    let Some(properties) = schema["properties"].as_object() else {
        return;
    };
    for (name, field) in properties {
        let path = format!("{prefix}{name}");
        let kind = match (field["type"].as_str(), field["items"]["type"].as_str()) {
            (Some("array"), Some(item)) => format!("array of {item}"),
            (Some(kind), _) => kind.to_string(),
            (None, _) if field["x-kubernetes-int-or-string"] == true => "integer or string".into(),
            (None, _) => "any".into(),
        };
        let description = field["description"].as_str().unwrap_or_default();
        out.push((path.clone(), kind, cell(description)));
        fields(&format!("{path}."), field, out);
        fields(&format!("{path}[]."), &field["items"], out);
    }
}

/// Every field of the CRD's spec and status, as `spec.x.y` paths.
fn crd_fields() -> Vec<(String, String, String)> {
    let crd = serde_json::to_value(DistributedLease::crd()).unwrap();
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"];
    let mut out = Vec::new();
    for part in ["spec", "status"] {
        fields(&format!("{part}."), &schema[part], &mut out);
    }
    out
}

/// (name as scraped, type, help) of every metric the product registers: each
/// `register("name", "help", metric)` under a `sub_registry_with_prefix`,
/// its type from the metric's declaration (a labelled family shows no
/// sample until it is used, so encoding a fresh registry would miss it).
fn metrics() -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for (file, _) in sources() {
        let source = std::fs::read_to_string(&file).unwrap();
        let code = source.split("#[cfg(test)]\nmod tests").next().unwrap_or(&source);
        let Some(prefix) = code.split("sub_registry_with_prefix(\"").nth(1) else {
            continue;
        };
        let prefix = prefix.split('"').next().unwrap();
        let pieces: Vec<&str> = code.split(".register(").collect();
        for (before, call) in pieces.iter().zip(&pieces[1..]) {
            // A receiver not bound to a `sub_registry_with_prefix` is the
            // root registry: no prefix (a name other projects defined, e.g.
            // client-go's leader_election_master_status).
            let receiver = before
                .trim_end()
                .rsplit(|c: char| !(c.is_alphanumeric() || c == '_'))
                .next()
                .unwrap_or_default();
            let root = !receiver.is_empty()
                && !code
                    .lines()
                    .any(|l| l.contains(&format!("let {receiver} = ")) && l.contains("sub_registry_with_prefix"));
            let call = call.split(");").next().unwrap();
            let literals: Vec<&str> = call.split('"').skip(1).step_by(2).collect();
            let [name, help, ..] = literals.as_slice() else {
                panic!("{}: a register call without name and help: {call}", file.display())
            };
            let metric =
                (call.trim_end().trim_end_matches(',').rsplit(',').next().unwrap().trim()).trim_end_matches(".clone()");
            let field = metric.rsplit('.').next().unwrap();
            let declaration = [format!("let {field} = "), format!("{field}: ")]
                .iter()
                .find_map(|d| code.split(d.as_str()).nth(1))
                .map(|rest| rest.lines().next().unwrap_or_default())
                .unwrap_or_else(|| panic!("{}: no declaration of {field}", file.display()));
            let kind = ["Counter", "Histogram", "Gauge"]
                .into_iter()
                .find(|k| declaration.contains(k))
                .unwrap_or_else(|| panic!("{}: {field} is of no metric type: {declaration}", file.display()));
            let prefixed = match root {
                true => name.to_string(),
                false => format!("{prefix}_{name}"),
            };
            let scraped = match kind {
                "Counter" => format!("{prefixed}_total"),
                _ => prefixed,
            };
            let family = if declaration.contains("Family<") {
                " (labelled)"
            } else {
                ""
            };
            out.push((scraped, format!("{}{family}", kind.to_lowercase()), help.to_string()));
        }
    }
    out
}

/// The string literals of a Rust source file outside `#[cfg(test)]`
/// modules, each with the code just before it.
fn literals_with_context(source: &str) -> Vec<(String, String)> {
    let code = source.split("#[cfg(test)]\nmod tests").next().unwrap_or(source);
    let mut out = Vec::new();
    let mut rest = code;
    let mut consumed = 0;
    while let Some(start) = rest.find('"') {
        let after = &rest[start + 1..];
        let Some(end) = after.find('"') else { break };
        let before = &code[..consumed + start];
        let context = before[before.len().saturating_sub(120)..].to_string();
        out.push((after[..end].to_string(), context));
        consumed += start + end + 2;
        rest = &after[end + 1..];
    }
    out
}

/// The product's Rust files that publish Events, with who publishes them
/// (test files left out).
fn sources() -> Vec<(std::path::PathBuf, &'static str)> {
    let mut out = Vec::new();
    for (dir, component) in [
        ("crates/leasehold-operator/src", "operator"),
        ("crates/leasehold-sidecar/src", "sidecar"),
        ("src/cmd/run", "runner"),
    ] {
        let mut folders = vec![root().join(dir)];
        while let Some(folder) = folders.pop() {
            for entry in std::fs::read_dir(folder).unwrap() {
                let path = entry.unwrap().path();
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                if path.is_dir() && name != "tests" {
                    folders.push(path);
                } else if name.ends_with(".rs") && name != "tests.rs" && name != "fixtures.rs" {
                    out.push((path, component));
                }
            }
        }
    }
    out.sort();
    out
}

/// Event reasons: a CamelCase literal that follows `EventType::…,` (the
/// sidecar's and the operator's Events), or that `ctx.publish` receives
/// before its action, or that a reconcile helper returns as the reason
/// with its message (`("Reason", format!(…))`), or that the reconcile's
/// plan makes a `Note` of.
fn event_reasons() -> BTreeSet<(String, &'static str)> {
    let mut reasons = BTreeSet::new();
    for (file, component) in sources() {
        let source = std::fs::read_to_string(&file).unwrap();
        let literals = literals_with_context(&source);
        for (i, (literal, context)) in literals.iter().enumerate() {
            // A condition's status (True, False, Unknown) is never a reason.
            let camel = literal.len() > 2
                && literal.starts_with(|c: char| c.is_ascii_uppercase())
                && literal.chars().all(|c| c.is_ascii_alphabetic())
                && !matches!(literal.as_str(), "True" | "False" | "Unknown");
            if !camel {
                continue;
            }
            let tail = context.trim_end();
            let after_type = tail.ends_with(',')
                && (tail.trim_end_matches(',').trim_end().ends_with("EventType::Normal")
                    || tail.trim_end_matches(',').trim_end().ends_with("EventType::Warning"));
            // ctx.publish(lease, kind, "Reason", "Action", note)
            let before_action = tail.ends_with(',')
                && context.contains("publish(")
                && literals.get(i + 1).is_some_and(|(next, between)| {
                    next.starts_with(char::is_uppercase) && between.ends_with(&format!("\"{literal}\", "))
                });
            let returned_with_message = tail.ends_with('(') && source.contains(&format!("(\"{literal}\", format!("));
            let returned_in_tuple = tail.ends_with('(')
                && source.contains(&format!("\"{literal}\",\n"))
                && tail.trim_end_matches('(').trim_end().ends_with("=>");
            // The operator's plan: Note::normal("Reason", …), Note::warning(…)
            // and Note { reason: "Reason", … }.
            let planned =
                tail.ends_with("Note::normal(") || tail.ends_with("Note::warning(") || tail.ends_with("reason:");
            if after_type || before_action || returned_with_message || returned_in_tuple || planned {
                reasons.insert((literal.clone(), component));
            }
        }
    }
    reasons
}

/// Every command and subcommand's flags: (command, flag, env, default, help).
fn flags() -> Vec<(String, String, String, String, String)> {
    let mut out = Vec::new();
    let cli = leasehold::cmd::Cli::command();
    let mut commands = vec![("leasehold".to_string(), cli)];
    while let Some((name, command)) = commands.pop() {
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            if arg.is_hide_set() || ["help", "version"].contains(&id) {
                continue;
            }
            let flag = match arg.get_long() {
                Some(long) => format!("--{long}"),
                None => format!("<{}>", id.to_uppercase()),
            };
            let env = arg
                .get_env()
                .map(|e| e.to_string_lossy().into_owned())
                .unwrap_or_default();
            let default = (arg.get_default_values().iter())
                .map(|v| v.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(", ");
            let help = arg.get_help().map(|h| cell(&h.to_string())).unwrap_or_default();
            out.push((name.clone(), flag, env, default, help));
        }
        let mut subcommands: Vec<_> = command
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
            .map(|s| (format!("{name} {}", s.get_name()), s.clone()))
            .collect();
        subcommands.reverse();
        commands.extend(subcommands);
    }
    out
}

fn generate() -> String {
    let mut doc = String::from(
        "# Reference (generated)\n\n<!-- Generated from the code by tests/install/docs_reference.rs; do not edit.\n     \
         Regenerate: LEASEHOLD_BLESS=1 cargo nextest run --test suite install::docs_reference -->\n\n\
         What each part means and how they work together: [operator.md](operator.md) (the resource),\n\
         the [README](../README.md) (the sidecar), [run.md](run.md), [versions.md](versions.md),\n\
         [partitions.md](partitions.md).\n\n## DistributedLease fields\n\n| field | type | description |\n|---|---|---|\n",
    );
    for (path, kind, description) in crd_fields() {
        doc.push_str(&format!("| `{path}` | {kind} | {description} |\n"));
    }
    doc.push_str("\n## Metrics\n\nThe sidecar's on its metrics port (`/metrics`, default 4041), the operator's on `--listen` (`/metrics`, default `0.0.0.0:8080`).\n\n| metric | type | help |\n|---|---|---|\n");
    for (name, kind, help) in metrics() {
        doc.push_str(&format!("| `{name}` | {kind} | {} |\n", cell(&help)));
    }
    doc.push_str("\n## Event reasons\n\n| reason | emitted by |\n|---|---|\n");
    for (reason, component) in event_reasons() {
        doc.push_str(&format!("| `{reason}` | {component} |\n"));
    }
    doc.push_str("\n## Commands, flags and environment variables\n\nEvery flag can be set by its environment variable instead.\n");
    let mut current = String::new();
    for (command, flag, env, default, help) in flags() {
        if command != current {
            doc.push_str(&format!(
                "\n### `{command}`\n\n| flag | environment | default | meaning |\n|---|---|---|---|\n"
            ));
            current = command;
        }
        let quoted = |s: &str| if s.is_empty() { String::new() } else { format!("`{s}`") };
        doc.push_str(&format!(
            "| `{flag}` | {} | {} | {help} |\n",
            quoted(&env),
            quoted(&cell(&default))
        ));
    }
    doc
}

#[test]
fn the_reference_is_generated_from_the_code() {
    let generated = generate();
    let path = root().join(REFERENCE);
    if std::env::var_os("LEASEHOLD_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let written = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        written == generated,
        "{REFERENCE} is not what the code generates: regenerate it with \
         LEASEHOLD_BLESS=1 cargo nextest run --test suite install::docs_reference"
    );
}

/// The hand-written docs (README and docs/, the generated reference aside).
fn hand_docs() -> String {
    let mut text = std::fs::read_to_string(root().join("README.md")).unwrap();
    for entry in std::fs::read_dir(root().join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") && !path.ends_with(REFERENCE) {
            text.push_str(&std::fs::read_to_string(path).unwrap());
        }
    }
    text
}

/// What of `names` `docs` never mentions in backquotes.
fn unmentioned<'a>(docs: &str, names: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    names
        .into_iter()
        .filter(|name| !docs.contains(&format!("`{name}")) && !docs.contains(&format!("{name}`")))
        .collect()
}

#[test]
fn the_hand_written_docs_explain_every_reason_and_metric() {
    let docs = hand_docs();
    let reasons = event_reasons();
    assert!(reasons.len() >= 10, "the reason scan finds the Events: {reasons:?}");
    let missing = unmentioned(&docs, reasons.iter().map(|(r, _)| r.as_str()));
    assert_eq!(missing, Vec::<&str>::new(), "Event reasons no doc explains");
    let metrics = metrics();
    let missing = unmentioned(&docs, metrics.iter().map(|(m, _, _)| m.as_str()));
    assert_eq!(missing, Vec::<&str>::new(), "metrics no doc explains");
}

/// docs/operator.md's tables name every spec and status field (a nested
/// field by its path below its parent's row, e.g. `store.postgres.table`).
#[test]
fn the_operator_doc_names_every_field() {
    let doc = std::fs::read_to_string(root().join("docs/operator.md")).unwrap();
    let fields = crd_fields();
    let missing: Vec<&str> = (fields.iter())
        .map(|(path, _, _)| path.split_once('.').unwrap().1)
        // A LabelSelector's own fields are Kubernetes'.
        .filter(|field| !field.contains("[]") && !field.starts_with("selector.") && field.split('.').count() <= 3)
        .filter(|field| !doc.contains(&format!("`{field}`")) && !doc.contains(&format!("`{field}.")))
        .collect();
    assert_eq!(missing, Vec::<&str>::new(), "docs/operator.md lacks these fields");
}

/// The checks above catch what they are for: a reason, a metric and a field
/// the docs do not mention are found.
#[test]
fn the_checks_catch_an_undocumented_name() {
    let docs = hand_docs();
    assert_eq!(
        unmentioned(&docs, ["NoSuchReason", "leasehold_no_such_metric"]).len(),
        2
    );
    let reasons = event_reasons();
    for reason in [
        "Acquired",
        "TimingAtRisk",
        "LeaderVersionChanged",
        "StoreUnavailable",
        "StaleLabelCleared",
    ] {
        assert!(
            reasons.iter().any(|(r, _)| r == reason),
            "{reason} not found by the scan: {reasons:?}"
        );
    }
    let scanned = literals_with_context("ctx.publish(lease, EventType::Warning, \"Planted\", \"Act\", m)");
    assert_eq!(scanned[0].0, "Planted");
    for reason in [
        "HolderChanged",
        "PartitionsChanged",
        "RolloutWouldStall",
        "LabelRepairFailed",
    ] {
        assert!(
            reasons.iter().any(|(r, _)| r == reason),
            "{reason} (the reconcile plan's) not found by the scan: {reasons:?}"
        );
    }
    for condition in ["Ready", "RolloutSafe"] {
        assert!(
            !reasons
                .iter()
                .any(|(r, component)| r == condition && *component == "operator"),
            "{condition} is a condition type, not an Event reason: {reasons:?}"
        );
    }
}

/// Flags the docs give to other tools (kubectl, helm, cargo, kind, docker,
/// CockroachDB, kube-apiserver, kube-controller-manager, the test-cluster tool's `start.sh`): not leasehold's, so not checked against its commands.
const OTHER_TOOLS_FLAGS: &[&str] = &[
    "--all-targets",
    "--api-port",
    "--as",
    "--bench",
    "--benches",
    "--bin",
    "--bins",
    "--bump-revision",
    "--cascade",
    "--check",
    "--create-namespace",
    "--event-ttl",
    "--example",
    "--examples",
    "--features",
    "--field-selector",
    "--for",
    "--force-conflicts",
    "--from-literal",
    "--grace-period",
    "--image",
    "--lib",
    "--locked",
    "--max-offset",
    "--name-only",
    "--no-default-features",
    "--no-node",
    "--no-run",
    "--overwrite",
    "--path",
    "--release",
    "--reuse-values",
    "--server-side",
    "--set",
    "--since",
    "--target",
    "--test",
    "--tests",
    "--timeout",
    "--timings",
    "--type",
    "--use-service-account-credentials",
    "--wait",
    "--workspace",
];

/// Folders of other projects' source trees the docs cite (Kubernetes' own
/// `pkg/…`) and names that look like paths but are not (a Spanner role).
const OTHER_PATHS: &[&str] = &["pkg/", "staging/", "roles/"];

/// Conditions of Kubernetes' own objects the docs mention (a Deployment's).
const OTHER_CONDITIONS: &[&str] = &["Progressing", "Available"];

/// Every file the repository tracks, by its path from the root.
fn repository_files() -> Vec<String> {
    let out = std::process::Command::new("git")
        .args(["ls-files", "--cached", "--others", "--exclude-standard"])
        .current_dir(root())
        .output()
        .expect("running git ls-files");
    assert!(
        out.status.success(),
        "git ls-files: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect()
}

/// What the hand-written docs name that the code does not have: `Type=True`
/// conditions whose type the code never names, `--flags`
/// of no leasehold command (and no other tool's, above), `leasehold_…`
/// metrics nobody exports (table names the code uses aside), and file
/// paths (in backquotes) that end no file of the repository.
fn names_the_code_lacks(docs: &str) -> Vec<String> {
    let known_flags: BTreeSet<String> = flags().into_iter().map(|(_, flag, ..)| flag).collect();
    let known_metrics: BTreeSet<String> = metrics().into_iter().map(|(name, ..)| name).collect();
    let files = repository_files();
    let code: String = (files.iter())
        .filter(|f| (f.starts_with("src/") || f.starts_with("crates/")) && f.ends_with(".rs"))
        .map(|f| std::fs::read_to_string(root().join(f)).unwrap())
        .collect();
    let mut lacking = BTreeSet::new();
    let word = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    for (at, _) in docs.match_indices("--") {
        let before = docs[..at].chars().next_back();
        let name: String = docs[at + 2..].chars().take_while(|&c| word(c)).collect();
        if before.is_some_and(|c| word(c) || c == '-')
            || !name.starts_with(|c: char| c.is_ascii_lowercase())
            || name.ends_with('-')
        {
            continue;
        }
        let flag = format!("--{name}");
        if !known_flags.contains(&flag) && !OTHER_TOOLS_FLAGS.contains(&flag.as_str()) && flag != "--help" {
            lacking.insert(format!("flag {flag}"));
        }
    }
    for (at, _) in docs.match_indices("leasehold_") {
        if docs[..at].chars().next_back().is_some_and(word) {
            continue;
        }
        let name: String = docs[at..]
            .chars()
            .take_while(|&c| c.is_ascii_lowercase() || c == '_')
            .collect();
        // `leasehold_core::lease`: a path into one of the workspace's crates.
        if docs[at + name.len()..].starts_with("::") {
            if !root().join("crates").join(name.replace('_', "-")).is_dir() {
                lacking.insert(format!("crate {name}"));
            }
            continue;
        }
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .fold(name.as_str(), |n, suffix| n.strip_suffix(suffix).unwrap_or(n));
        // A table name is a string in the code (a default), not a metric.
        if !known_metrics.contains(family) && !code.contains(&format!("\"{name}\"")) {
            lacking.insert(format!("metric {name}"));
        }
    }
    // `Type=Status`: a condition the code must write (its type a string in
    // the code).
    for status in ["=True", "=False", "=Unknown"] {
        for (at, _) in docs.match_indices(status) {
            let kind: String = (docs[..at].chars().rev())
                .take_while(char::is_ascii_alphabetic)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            if kind.starts_with(|c: char| c.is_ascii_uppercase())
                && !OTHER_CONDITIONS.contains(&kind.as_str())
                && !code.contains(&format!("\"{kind}\""))
            {
                lacking.insert(format!("condition {kind}"));
            }
        }
    }
    for quoted in docs.split('`').skip(1).step_by(2) {
        let last = quoted.rsplit('/').next().unwrap_or_default();
        let path_like = quoted.contains('/')
            && (last.contains('.') || quoted.ends_with('/'))
            && quoted.chars().all(|c| word(c) || matches!(c, '/' | '.' | '*'))
            && !quoted.starts_with(['/', '.'])
            && !OTHER_PATHS.iter().any(|p| quoted.starts_with(p));
        if !path_like {
            continue;
        }
        // Docs name a file by its path from the repository or from a
        // folder the sentence is about (`config/settings.rs` in the
        // sidecar's section): it must end some path of the repository.
        let (dir, suffix) = quoted.split_once('*').unwrap_or((quoted, ""));
        let exists = files.iter().any(|f| {
            f.strip_suffix(suffix).is_some_and(|f| {
                let f = format!("/{f}");
                match dir.ends_with('/') || !suffix.is_empty() {
                    // A folder, or `folder/*.rs`: some file lies below it.
                    true => f.contains(&format!("/{dir}")),
                    false => f.ends_with(&format!("/{dir}")),
                }
            })
        });
        if !exists {
            lacking.insert(format!("path {quoted}"));
        }
    }
    lacking.into_iter().collect()
}

#[test]
fn the_docs_name_only_flags_metrics_conditions_and_files_the_code_has() {
    let docs = hand_docs();
    assert_eq!(
        names_the_code_lacks(&docs),
        Vec::<String>::new(),
        "README.md and docs/ name these"
    );
    // The check itself: a renamed flag, a metric nobody exports and a moved
    // file are each caught.
    let planted = format!(
        "{docs}\n`leasehold status --watchh`, `leasehold_is_leading`, `tests/store_spanner.rs`, `Elected=True`\n"
    );
    assert_eq!(
        names_the_code_lacks(&planted),
        [
            "condition Elected",
            "flag --watchh",
            "metric leasehold_is_leading",
            "path tests/store_spanner.rs"
        ]
    );
}
