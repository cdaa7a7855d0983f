//! The monitoring that ships with leasehold: the Prometheus alerting rules
//! (manifests/prometheus/leasehold-rules.yaml, its copy in the chart) under
//! the real `promtool test rules`, planted bugs in them caught, and every
//! metric the rules and the Grafana dashboard query exported by the code.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use leasehold::lease::Timing;
use leasehold::lease::budget::AT_RISK_SHARE;
use leasehold::lease::session::Collected;
use leasehold::operator::metrics::Outcome;
use leasehold::sidecar::budget::RenewBudget;
use leasehold::sidecar::metrics::{ChangeLabels, FailureLabels, OpLabels};
use prometheus_client::registry::Registry;

const RULES: &str = "manifests/prometheus/leasehold-rules.yaml";
const CHART_RULES: &str = "charts/leasehold/files/leasehold-rules.yaml";
const RULES_TESTS: &str = "tests/prometheus/leasehold-rules.test.yaml";
const DASHBOARD: &str = "charts/leasehold/files/leasehold-dashboard.json";
/// Grafana's core panel types the dashboard may use.
const PANEL_TYPES: &[&str] = &[
    "timeseries",
    "stat",
    "gauge",
    "bargauge",
    "table",
    "state-timeline",
    "text",
];

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `promtool test rules FILE`: whether every test passed, and its output.
fn promtool_test_rules(tests: &Path) -> (bool, String) {
    let out = Command::new("promtool")
        .arg("test")
        .arg("rules")
        .arg(tests)
        .output()
        .unwrap_or_else(|e| {
            panic!("running promtool: {e}; install Prometheus's promtool (Debian: apt-get install prometheus; scripts/setup-servers.sh does)")
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The sample names the sidecar and the operator export (counters with
/// `_total`, histograms with `_bucket`, `_sum` and `_count`), from their
/// registries' own exposition.
fn exported_metrics() -> BTreeSet<String> {
    let mut registry = Registry::default();
    let sidecar = leasehold::sidecar::metrics::Metrics::new(&mut registry);
    RenewBudget::new(&Timing::default(), &mut registry);
    let operator = leasehold::operator::metrics::Metrics::new(&mut registry);
    // A family is exposed once it has a series.
    let op = OpLabels { op: "renew" };
    sidecar.store_calls.get_or_create(&op).inc();
    sidecar.store_latency.get_or_create(&op).observe(0.01);
    sidecar
        .store_failures
        .get_or_create(&FailureLabels {
            op: "renew",
            kind: "unavailable",
        })
        .inc();
    sidecar
        .leadership_changes
        .get_or_create(&ChangeLabels { reason: "acquired" })
        .inc();
    operator.reconciled(Outcome::StoreError, Duration::from_millis(5));
    operator.event_failed("LeaderElected");
    operator.collected(Collected { sessions: 1, locks: 1 });
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').unwrap();
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "histogram" => &["_bucket", "_sum", "_count"],
            _ => &[""],
        };
        names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
    }
    names
}

/// Every name starting `leasehold_` in `text`.
fn metrics_named_in(text: &str) -> BTreeSet<String> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.split(|c: char| !is_name(c))
        .filter(|word| word.starts_with("leasehold_"))
        .map(String::from)
        .collect()
}

#[test]
fn the_alerting_rules_pass_their_promtool_tests() {
    let (passed, output) = promtool_test_rules(&repo().join(RULES_TESTS));
    assert!(passed, "promtool test rules {RULES_TESTS}:\n{output}");
}

#[test]
fn the_chart_ships_the_same_rules() {
    assert!(
        read(CHART_RULES) == read(RULES),
        "{CHART_RULES} differs from {RULES}: copy {RULES} over it (the chart's PrometheusRule reads its own copy)"
    );
}

/// The `leasehold_…` names in `text` that the code does not export.
fn unknown_metrics(text: &str) -> Vec<String> {
    metrics_named_in(text)
        .difference(&exported_metrics())
        .cloned()
        .collect()
}

#[test]
fn the_rules_query_only_metrics_the_code_exports() {
    let rules = read(RULES);
    assert!(metrics_named_in(&rules).contains("leasehold_is_leader"), "{rules}");
    let unknown = unknown_metrics(&rules);
    assert!(
        unknown.is_empty(),
        "{RULES} queries {unknown:?}, which the code does not export"
    );
    // The check itself: a renamed metric is caught.
    let planted = rules.replace("leasehold_is_leader)", "leasehold_leader)");
    assert_eq!(unknown_metrics(&planted), ["leasehold_leader"]);
}

const RUNBOOKS: &str = "docs/runbooks.md";
/// Where the rules' `runbook_url`s point: docs/runbooks.md on the project's
/// main branch.
const RUNBOOK_URL: &str = "https://github.com/leasehold/leasehold/blob/main/docs/runbooks.md";

/// Alerts whose `runbook_url` is missing or does not lead to a section of
/// docs/runbooks.md (a `## AlertName` heading, whose anchor is the name in
/// lower case), and runbook sections for alerts the rules do not have.
fn runbook_gaps(rules: &str, runbooks: &str) -> Vec<String> {
    let rules: serde_yaml::Value = serde_yaml::from_str(rules).unwrap();
    let headings: BTreeSet<&str> = runbooks.lines().filter_map(|line| line.strip_prefix("## ")).collect();
    let mut gaps = Vec::new();
    let mut alerts = BTreeSet::new();
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let alert = rule["alert"].as_str().unwrap();
            alerts.insert(alert);
            let url = rule["annotations"]["runbook_url"].as_str();
            let expected = format!("{RUNBOOK_URL}#{}", alert.to_lowercase());
            if url != Some(expected.as_str()) {
                gaps.push(format!("{alert}: runbook_url {url:?}, expected {expected}"));
            }
            if !headings.contains(alert) {
                gaps.push(format!("{alert}: no `## {alert}` in {RUNBOOKS}"));
            }
        }
    }
    for heading in headings.difference(&alerts) {
        gaps.push(format!("{RUNBOOKS} has `## {heading}`, which is no alert"));
    }
    gaps
}

#[test]
fn every_alert_links_its_runbook() {
    let (rules, runbooks) = (read(RULES), read(RUNBOOKS));
    let gaps = runbook_gaps(&rules, &runbooks);
    assert!(gaps.is_empty(), "{gaps:#?}");
    // The check itself: a renamed section and a dropped link are caught.
    let renamed = runbooks.replace("## LeaseholdNoLeader", "## LeaseholdLeaderless");
    assert_eq!(runbook_gaps(&rules, &renamed).len(), 2, "renamed section");
    let unlinked = rules.replace(&format!("{RUNBOOK_URL}#leaseholdoperatordown"), "");
    assert_eq!(runbook_gaps(&unlinked, &runbooks).len(), 1, "dropped link");
}

#[test]
fn the_timing_alert_uses_the_sidecars_at_risk_share() {
    let rule = format!("(leasehold_renew_budget_used) > {AT_RISK_SHARE}");
    assert!(read(RULES).contains(&rule), "{RULES} has no `{rule}`");
}

/// Planted bugs: each mutant of the rules must fail the same promtool tests.
#[test]
fn the_promtool_tests_catch_planted_bugs_in_the_rules() {
    let rules = read(RULES);
    let tests = read(RULES_TESTS);
    let dir = std::env::temp_dir().join(format!("leasehold-rules-mutants-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mutants = [
        (
            "two leaders: threshold 2",
            "(leasehold_is_leader) > 1",
            "(leasehold_is_leader) > 2",
        ),
        (
            "two leaders: summed per pod, not per lock",
            "sum by (namespace, lease) (leasehold_is_leader)",
            "sum by (namespace, lease, pod) (leasehold_is_leader)",
        ),
        ("two leaders: no `for`", "> 1\n        for: 1m", "> 1\n        for: 0s"),
        (
            "no leader: a lock whose candidates are gone is forgotten",
            "(last_over_time(leasehold_is_leader[15m]))",
            "(leasehold_is_leader)",
        ),
        (
            "no leader: a partitioned lock counted as leaderless",
            "\n            unless on (namespace, lease) (max_over_time(leasehold_partition_members[15m]) > 0)",
            "",
        ),
        (
            "no leader: a follower counted as a leader",
            "(leasehold_is_leader == 1)",
            "(leasehold_is_leader >= 0)",
        ),
        (
            "no leader: a cluster standing by for another cluster's leader counted as leaderless",
            "\n            unless on (namespace, lease) (leasehold_leader_elsewhere == 1)",
            "",
        ),
        (
            "no leader: a candidate following nobody counted as standing by",
            "(leasehold_leader_elsewhere == 1)",
            "(leasehold_leader_elsewhere >= 0)",
        ),
        (
            "often leaderless: a quarter dark tolerated",
            "[10m:])) < 0.75",
            "[10m:])) < 0.7",
        ),
        (
            "often leaderless: a young lock's dark seconds weighed against its own few samples",
            "1 - count_over_time((max by (namespace, lease) (leasehold_is_leader) == 0)[10m:]) / scalar(count_over_time(vector(1)[10m:]))",
            "avg_over_time((max by (namespace, lease) (leasehold_is_leader))[10m:])",
        ),
        (
            "often leaderless: a lock dark for good (or never led) counted",
            "\n            and on (namespace, lease) (max_over_time(leasehold_is_leader[2m]) == 1)",
            "",
        ),
        (
            "often leaderless: a lock led from another cluster counted",
            "\n            unless on (namespace, lease) (max_over_time(leasehold_leader_elsewhere[10m]) == 1)",
            "",
        ),
        ("timing: threshold 0.35", "> 0.25", "> 0.35"),
        ("store failures: lost counted", "{kind!=\"lost\"}", ""),
        (
            "stalled: a new pod's first samples judged as silence",
            "\n            and on (namespace, lease, pod) sum by (namespace, lease, pod) (leasehold_store_calls_total offset 2m)",
            "",
        ),
        (
            "stalled: one operation only",
            "increase(leasehold_store_calls_total[2m])",
            "increase(leasehold_store_calls_total{op=\"acquire\"}[2m])",
        ),
        ("operator: every outcome counted", "{outcome=\"store_error\"}", ""),
        ("operator errors: every outcome counted", "{outcome=\"error\"}", ""),
        (
            "operator down: replicas that are gone are forgotten",
            "(last_over_time(leasehold_operator_is_leader[15m]))",
            "(leasehold_operator_is_leader)",
        ),
        (
            "operator down: a standby counted as active",
            "(leasehold_operator_is_leader == 1)",
            "(leasehold_operator_is_leader >= 0)",
        ),
        (
            "operator down: no `for`",
            "== 1)\n        for: 5m",
            "== 1)\n        for: 0s",
        ),
    ];
    let mut survived = Vec::new();
    for (i, (name, from, to)) in mutants.iter().enumerate() {
        assert_eq!(
            rules.matches(from).count(),
            1,
            "mutant {name}: `{from}` once in {RULES}"
        );
        let mutant_rules = dir.join(format!("rules-{i}.yaml"));
        std::fs::write(&mutant_rules, rules.replace(from, to)).unwrap();
        let mutant_tests = dir.join(format!("tests-{i}.yaml"));
        let pointed = tests.replace(
            "../../manifests/prometheus/leasehold-rules.yaml",
            mutant_rules.to_str().unwrap(),
        );
        assert_ne!(pointed, tests, "{RULES_TESTS} names {RULES} in rule_files");
        std::fs::write(&mutant_tests, pointed).unwrap();
        if promtool_test_rules(&mutant_tests).0 {
            survived.push(*name);
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        survived.is_empty(),
        "planted bugs the promtool tests let pass: {survived:?}"
    );
}

/// scripts/check-dashboard.sh on `json`: whether Grafana's dashboard types
/// accept it, and the compiler's output.
fn check_dashboard(json: &str) -> (bool, String) {
    let dir = std::env::temp_dir().join(format!("leasehold-dashboard-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("dashboard-{:x}.json", json.len()));
    std::fs::write(&file, json).unwrap();
    let out = Command::new(repo().join("scripts/check-dashboard.sh"))
        .arg(&file)
        .output()
        .unwrap_or_else(|e| panic!("running scripts/check-dashboard.sh (needs Node.js and npm): {e}"));
    std::fs::remove_file(&file).unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn the_dashboard_type_checks_against_grafanas_dashboard_schema() {
    let dashboard = read(DASHBOARD);
    let (valid, output) = check_dashboard(&dashboard);
    assert!(valid, "{DASHBOARD} against @grafana/schema:\n{output}");
    // Planted bugs: a wrong type and a field Grafana does not know.
    for (from, to) in [
        ("\"refresh\": \"30s\"", "\"refresh\": 30"),
        ("\"gridPos\": {", "\"gridPos\": {\"height\": 8, "),
        ("\"h\": 8,", "\"h\": \"8\","),
    ] {
        assert!(dashboard.contains(from), "{DASHBOARD} has no {from}");
        let (valid, output) = check_dashboard(&dashboard.replacen(from, to, 1));
        assert!(!valid, "{from} -> {to} passed the dashboard check:\n{output}");
    }
}

/// Every query of every panel: (panel title, panel type, expression).
fn dashboard_queries(dashboard: &serde_json::Value) -> Vec<(String, String, String)> {
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().unwrap_or_default().to_string();
        let kind = panel["type"].as_str().unwrap_or_default().to_string();
        let targets = panel["targets"].as_array().map(Vec::as_slice).unwrap_or_default();
        assert!(!targets.is_empty(), "panel {title:?} queries nothing");
        for target in targets {
            let expr = target["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("panel {title:?}: a target without expr"));
            queries.push((title.clone(), kind.clone(), expr.to_string()));
        }
    }
    queries
}

#[test]
fn the_dashboard_answers_the_operators_questions_with_exported_metrics() {
    let dashboard: serde_json::Value = serde_json::from_str(&read(DASHBOARD)).unwrap();
    let queries = dashboard_queries(&dashboard);
    for (title, kind, expr) in &queries {
        assert!(
            PANEL_TYPES.contains(&kind.as_str()),
            "panel {title:?}: type {kind:?} is not a core panel"
        );
        let unknown = unknown_metrics(expr);
        assert!(
            unknown.is_empty(),
            "panel {title:?} queries {unknown:?}, which the code does not export"
        );
        // The operator's panels are per install, not per lease.
        if title.starts_with("Operator: ") {
            assert!(expr.contains("leasehold_operator_"), "panel {title:?}: {expr}");
        } else {
            assert!(
                expr.contains("lease=~\"$lease\""),
                "panel {title:?} ignores the lease variable: {expr}"
            );
        }
    }
    let all: String = queries.iter().map(|(_, _, e)| e.as_str()).collect();
    for needed in [
        "sum by (namespace, lease) (leasehold_is_leader",
        "leasehold_transitions_total",
        // Partitioned sidecars renew a session, not a lease.
        "leasehold_store_latency_seconds_bucket{op=~\"renew|renew_session\"",
        "sum by (namespace) (leasehold_operator_is_leader)",
        "leasehold_operator_reconciles_total",
        "leasehold_renew_budget_used",
        "leasehold_store_failures_total",
    ] {
        assert!(all.contains(needed), "no panel queries {needed}");
    }
    // The budget panel marks the same at-risk share as the sidecar and the alert.
    let budget = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| {
            p["targets"][0]["expr"]
                .as_str()
                .unwrap()
                .contains("leasehold_renew_budget_used")
        })
        .unwrap();
    let steps = &budget["fieldConfig"]["defaults"]["thresholds"]["steps"];
    assert_eq!(steps[1]["value"].as_f64(), Some(AT_RISK_SHARE), "{steps}");
}
