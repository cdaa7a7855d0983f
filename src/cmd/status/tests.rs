//! `leasehold status` on leases of known status, listed and watched through
//! the in-memory API server model.

use clap::Parser;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::*;
use crate::cmd::{Cli, Command};
use crate::testing::api::ApiServer;

const LEASES: &str = "/apis/leasehold.dev/v1alpha1/namespaces/shop/distributedleases";

fn now() -> Timestamp {
    "2026-11-25T10:00:00Z".parse().unwrap()
}

fn ago(seconds: i64) -> Timestamp {
    now() - SignedDuration::from_secs(seconds)
}

fn condition(type_: &str, status: &str, reason: &str, since: Timestamp) -> Value {
    json!({"type": type_, "status": status, "reason": reason, "message": "m",
           "lastTransitionTime": since.to_string()})
}

fn lease(name: &str, leadership: Value, status: Value) -> Value {
    json!({
        "apiVersion": "leasehold.dev/v1alpha1", "kind": "DistributedLease",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"store": {"spanner": {"database": "projects/p/instances/i/databases/d"}},
                 "selector": {"matchLabels": {"app": name}}, "leadership": leadership},
        "status": status,
    })
}

/// web: led for 90 s (its Ready condition older); jobs: leaderless for
/// 30 s, its last token 10 minutes old; batch: partitioned.
fn leases() -> [Value; 3] {
    let token = |at: Timestamp| at.as_nanosecond().to_string();
    [
        lease(
            "web",
            json!({"prefer": "Newest", "versionFence": true}),
            json!({"holder": "east/shop/web-1#7f3a", "holderCluster": "east", "term": 4, "token": token(ago(90)),
                   "candidates": 3, "readyCandidates": 2, "transitions": 4,
                   "conditions": [condition("Valid", "True", "Valid", ago(7200)),
                                  condition("Ready", "True", "LeaderElected", ago(5000))]}),
        ),
        lease(
            "jobs",
            json!({}),
            json!({"term": 12, "token": token(ago(600)), "candidates": 0, "readyCandidates": 0,
                   "conditions": [condition("Ready", "False", "NoLeader", ago(30)),
                                  condition("StoreReady", "True", "Reachable", ago(90000))]}),
        ),
        lease(
            "batch",
            json!({"prefer": "Oldest"}),
            json!({"candidates": 2, "readyCandidates": 2,
                   "partitions": {"count": 8, "members": 2, "unowned": 1, "balance": 0, "assignment": []},
                   "conditions": []}),
        ),
    ]
}

fn line(lease: &Value) -> LeaseStatus {
    LeaseStatus::of(&crate::api::client::object_from_value(lease).unwrap(), now())
}

#[test]
fn a_line_holds_the_holder_term_ages_candidates_policy_and_conditions() {
    let [web, jobs, _] = leases();
    let web = line(&web);
    assert_eq!(web.holder.as_deref(), Some("east/shop/web-1#7f3a"));
    assert_eq!(web.holder_cluster.as_deref(), Some("east"), "where the leader runs");
    assert_eq!(web.term, Some(4));
    assert_eq!(web.token_age_seconds, Some(90.0));
    assert_eq!(
        web.since_transition_seconds,
        Some(90.0),
        "the acquisition is the later change"
    );
    assert_eq!((web.ready_candidates, web.candidates), (2, 3));
    assert_eq!((web.prefer, web.version_fence), (Prefer::Newest, true));
    let jobs = line(&jobs);
    assert_eq!(jobs.holder, None);
    assert_eq!(jobs.token_age_seconds, Some(600.0));
    assert_eq!(
        jobs.since_transition_seconds,
        Some(30.0),
        "losing the leader is the later change"
    );
    assert_eq!(
        jobs.conditions[0],
        ConditionState {
            type_: "Ready".into(),
            status: "False".into(),
            reason: "NoLeader".into()
        }
    );
}

#[test]
fn the_table_aligns_one_line_per_lease() {
    let lines: Vec<LeaseStatus> = leases().iter().map(line).collect();
    assert_eq!(
        table(&lines),
        "\
NAMESPACE   NAME    HOLDER                                 CLUSTER   TERM   TOKEN AGE   SINCE CHANGE   READY   VERSIONS       CONDITIONS
shop        web     east/shop/web-1#7f3a                   east      4      1m30s       1m30s          2/3     Newest+fence   Valid=True,Ready=True
shop        jobs    <none>                                 -         12     10m0s       30s            0/0     None           Ready=False,StoreReady=True
shop        batch   <8 partitions, 2 members, 1 unowned>   -         -      -           -              2/2     Oldest
"
    );
}

#[test]
fn ages_read_like_kubectls() {
    let shown: Vec<String> = [
        None,
        Some(0.4),
        Some(59.9),
        Some(61.0),
        Some(7260.0),
        Some(2.0 * 86400.0 + 3600.0),
    ]
    .into_iter()
    .map(age)
    .collect();
    assert_eq!(shown, ["-", "0s", "59s", "1m1s", "2h1m", "2d1h"]);
}

#[test]
fn json_names_every_field() {
    let [web, ..] = leases();
    let value = serde_json::to_value(line(&web)).unwrap();
    assert_eq!(
        value,
        json!({"namespace": "shop", "name": "web", "holder": "east/shop/web-1#7f3a",
               "holderCluster": "east", "term": 4,
               "token": web["status"]["token"], "tokenAgeSeconds": 90.0, "sinceTransitionSeconds": 90.0,
               "readyCandidates": 2, "candidates": 3, "prefer": "Newest", "versionFence": true,
               "conditions": [{"type": "Valid", "status": "True", "reason": "Valid"},
                              {"type": "Ready", "status": "True", "reason": "LeaderElected"}]})
    );
}

#[tokio::test]
async fn list_reads_the_leases_in_order() {
    let server = ApiServer::new(None);
    for lease in leases() {
        server.insert(LEASES, lease);
    }
    let api: Api<DistributedLease> = Api::namespaced(server.client("shop"), "shop");
    let names: Vec<String> = list(&api).await.unwrap().into_iter().map(|l| l.name).collect();
    assert_eq!(names, ["batch", "jobs", "web"]);
}

/// `watch` on the model's leases in `shop`, each line it prints sent on.
fn watch_lines(
    server: &ApiServer,
) -> (
    tokio::task::JoinHandle<Result<(), Error>>,
    mpsc::UnboundedReceiver<LeaseStatus>,
) {
    let api: Api<DistributedLease> = Api::namespaced(server.client("shop"), "shop");
    let (tx, lines) = mpsc::unbounded_channel();
    let watching = tokio::spawn(watch(api, move |line| {
        tx.send(line.clone()).unwrap();
        Ok(())
    }));
    (watching, lines)
}

#[tokio::test]
async fn watch_prints_each_change_but_not_the_ages_moving() {
    let server = ApiServer::new(None);
    let [web, ..] = leases();
    server.insert(LEASES, web.clone());
    let (watching, mut lines) = watch_lines(&server);
    let first = lines.recv().await.unwrap();
    assert_eq!((first.name.as_str(), first.term), ("web", Some(4)));

    // A renewal the operator wrote (only the time moved), then a new term.
    let mut renewed = web.clone();
    renewed["status"]["renewedAt"] = json!(now().to_string());
    server.insert(LEASES, renewed.clone());
    let mut handed_over = renewed;
    handed_over["status"]["holder"] = json!("shop/web-2#91c0");
    handed_over["status"]["term"] = json!(5);
    server.insert(LEASES, handed_over);
    let next = lines.recv().await.unwrap();
    assert_eq!(
        (next.holder.as_deref(), next.term),
        (Some("shop/web-2#91c0"), Some(5)),
        "the renewal alone printed nothing"
    );

    server.delete(LEASES, "web");
    let gone = lines.recv().await.unwrap();
    assert!(gone.deleted && gone.name == "web", "{gone:?}");
    assert!(gone.cells()[9] == "<deleted>");
    watching.abort();
}

/// A change made to a lease, and whether a printed line shows it.
type Change = fn(&mut Value);
type Shows = fn(&LeaseStatus) -> bool;

/// `--watch` prints a lease again on each change the README names besides
/// the holder: the term (the same pod's takeover), the candidates, the
/// version policy and the conditions; each change prints one line showing it.
#[tokio::test]
async fn watch_prints_a_change_of_term_candidates_policy_or_conditions() {
    let server = ApiServer::new(None);
    let [mut web, ..] = leases();
    server.insert(LEASES, web.clone());
    let (watching, mut lines) = watch_lines(&server);
    let mut shown = lines.recv().await.unwrap();
    let changes: [(&str, Change, Shows); 6] = [
        ("the term", |l| l["status"]["term"] = json!(5), |s| s.term == Some(5)),
        (
            "the ready candidates",
            |l| l["status"]["readyCandidates"] = json!(3),
            |s| s.ready_candidates == 3,
        ),
        (
            "the candidates",
            |l| l["status"]["candidates"] = json!(4),
            |s| s.candidates == 4,
        ),
        (
            "the preference",
            |l| l["spec"]["leadership"]["prefer"] = json!("Oldest"),
            |s| s.prefer == Prefer::Oldest,
        ),
        (
            "the fence",
            |l| l["spec"]["leadership"]["versionFence"] = json!(false),
            |s| !s.version_fence,
        ),
        (
            "a condition",
            |l| l["status"]["conditions"][1] = condition("Ready", "False", "NoLeader", now()),
            |s| s.conditions[1].status == "False" && s.conditions[1].reason == "NoLeader",
        ),
    ];
    for (what, change, shows) in changes {
        assert!(!shows(&shown), "{what}: already so before the change: {shown:?}");
        change(&mut web);
        server.insert(LEASES, web.clone());
        // One watch event of the in-memory model: a bound far above it.
        let next = tokio::time::timeout(std::time::Duration::from_secs(10), lines.recv())
            .await
            .unwrap_or_else(|_| panic!("{what}: no line printed for the change within 10 s"))
            .unwrap();
        assert!(
            shows(&next),
            "{what}: the line printed does not show the change: {next:?}"
        );
        assert_eq!(next.holder, shown.holder, "{what}: the holder stayed");
        shown = next;
    }
    assert!(lines.try_recv().is_err(), "one line per change");
    watching.abort();
}

#[test]
fn the_command_line_takes_namespace_output_and_watch() {
    let cli = Cli::try_parse_from(["leasehold", "status", "-n", "shop", "-o", "json", "--watch"]).unwrap();
    let Command::Status(args) = cli.command else {
        panic!("not status")
    };
    assert_eq!(
        (args.namespace.as_deref(), args.output, args.watch),
        (Some("shop"), Output::Json, true)
    );
    let cli = Cli::try_parse_from([
        "leasehold",
        "status",
        "-o",
        "yaml",
        "--kubeconfig",
        "/k",
        "--context",
        "kind-a",
    ])
    .unwrap();
    let Command::Status(args) = cli.command else {
        panic!("not status")
    };
    assert_eq!(args.output, Output::Yaml);
    assert_eq!(
        (args.cluster.kubeconfig.as_deref(), args.cluster.context.as_deref()),
        (Some("/k"), Some("kind-a"))
    );
    let wrong = Cli::try_parse_from(["leasehold", "status", "-o", "xml"])
        .unwrap_err()
        .to_string();
    assert!(wrong.contains("'xml'") && wrong.contains("--output"), "{wrong}");
}

/// `-o yaml` prints the lines `-o json` prints, as YAML.
#[test]
fn yaml_output_is_the_json_output() {
    let lines: Vec<LeaseStatus> = leases().iter().map(line).collect();
    let json = serde_json::to_value(&lines).unwrap();
    let yaml: Value = serde_yaml::from_str(&serde_yaml::to_string(&lines).unwrap()).unwrap();
    assert_eq!(yaml, json);
}

/// web's history: term 2 released, terms 3-4 unseen, term 5 leading.
fn with_history() -> Value {
    let [mut web, ..] = leases();
    web["status"]["history"] = json!([
        {"term": 2, "holder": "shop/web-0#a1", "token": "200", "acquiredAt": "2026-11-25T09:00:00Z", "ended": "Released"},
        {"term": 3, "missingThrough": 4},
        {"term": 5, "holder": "shop/web-1#b2", "token": "500", "acquiredAt": "2026-11-25T09:50:00Z"},
    ]);
    web
}

#[tokio::test]
async fn history_prints_terms_and_gaps_as_a_table_json_and_yaml() {
    let server = ApiServer::new(None);
    let web = with_history();
    server.insert(LEASES, web.clone());
    let api: Api<DistributedLease> = Api::namespaced(server.client("shop"), "shop");
    assert_eq!(
        history(&api, "web", Output::Table).await.unwrap(),
        "\
TERM   HOLDER                                              TOKEN   ACQUIRED AT            ENDED AT   ENDED
2      shop/web-0#a1                                       200     2026-11-25T09:00:00Z   -          Released
3-4    <not seen: the operator read none of these terms>   -       -                      -          -
5      shop/web-1#b2                                       500     2026-11-25T09:50:00Z   -          -
"
    );
    let json: Value = serde_json::from_str(&history(&api, "web", Output::Json).await.unwrap()).unwrap();
    assert_eq!(json, web["status"]["history"], "JSON is the status's own list");
    let yaml: Value = serde_yaml::from_str(&history(&api, "web", Output::Yaml).await.unwrap()).unwrap();
    assert_eq!(yaml, json, "YAML says the same as JSON");
}

#[tokio::test]
async fn history_of_a_missing_lease_names_it() {
    let server = ApiServer::new(None);
    let api: Api<DistributedLease> = Api::namespaced(server.client("shop"), "shop");
    let error = history(&api, "nope", Output::Table).await.unwrap_err();
    assert_eq!(error.to_string(), "cannot read DistributedLease nope");
}

#[test]
fn history_is_a_flag_that_names_the_lease() {
    let cli = Cli::try_parse_from(["leasehold", "status", "--history", "web", "-n", "shop", "-o", "json"]).unwrap();
    let Command::Status(args) = cli.command else {
        panic!("not status")
    };
    assert_eq!((args.history.as_deref(), args.output), (Some("web"), Output::Json));
    assert!(Cli::try_parse_from(["leasehold", "status", "--history", "web", "--watch"]).is_err());
}
