use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::json;

use super::*;

fn lease(name: &str, namespace: &str, selector: serde_json::Value) -> DistributedLease {
    leasehold_kubernetes::api::client::object_from_value(&json!({
        "apiVersion": "leasehold.dev/v1alpha1", "kind": "DistributedLease",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"store": {"spanner": {"database": "projects/p/instances/i/databases/d"}},
                 "selector": selector},
    }))
    .unwrap()
}

fn pod(name: &str, namespace: &str, labels: serde_json::Value) -> Pod {
    leasehold_kubernetes::api::client::object_from_value(
        &json!({"metadata": {"name": name, "namespace": namespace, "labels": labels}}),
    )
    .unwrap()
}

fn names(refs: Vec<ObjectRef<DistributedLease>>) -> Vec<String> {
    refs.into_iter()
        .map(|r| format!("{}/{}", r.namespace.unwrap_or_default(), r.name))
        .collect()
}

fn listed(selectors: &Selectors, leases: impl IntoIterator<Item = DistributedLease>) {
    selectors.follow(&watcher::Event::Init);
    for lease in leases {
        selectors.follow(&watcher::Event::InitApply(lease));
    }
    selectors.follow(&watcher::Event::InitDone);
}

/// A pod event reconciles exactly the leases in its namespace whose
/// selector matches it, whether the selector requires a label (filed under
/// it) or not (`in` of two values, `exists`: looked at for every pod).
#[test]
fn pod_events_map_to_the_leases_selecting_the_pod() {
    let selectors = Selectors::default();
    listed(
        &selectors,
        [
            lease("web", "prod", json!({"matchLabels": {"app": "web"}})),
            lease(
                "web-canary",
                "prod",
                json!({"matchLabels": {"app": "web", "track": "canary"}}),
            ),
            lease("web", "staging", json!({"matchLabels": {"app": "web"}})),
            lease("empty", "prod", json!({})),
            lease(
                "web-or-api",
                "prod",
                json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["web", "api"]}]}),
            ),
            lease(
                "tiered",
                "prod",
                json!({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}),
            ),
            lease(
                "in-one",
                "prod",
                json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]}),
            ),
        ],
    );
    let web = pod("web-0", "prod", json!({"app": "web"}));
    assert_eq!(
        names(selectors.leases_selecting(&web)),
        ["prod/in-one", "prod/web", "prod/web-or-api"],
        "an empty selector is invalid and selects nothing"
    );
    let tiered = pod("api-0", "prod", json!({"app": "api", "tier": "backend"}));
    assert_eq!(
        names(selectors.leases_selecting(&tiered)),
        ["prod/tiered", "prod/web-or-api"]
    );
    assert!(
        selectors
            .leases_selecting(&pod("x", "dev", json!({"app": "web"})))
            .is_empty()
    );
}

/// Each lease's selector is the one of its last event: a changed selector
/// applies at once, a deleted lease selects nothing, and a re-list replaces
/// the index when it is complete (until then the old one answers).
#[test]
fn selectors_follow_the_lease_watch() {
    let selectors = Selectors::default();
    let web = pod("web-0", "prod", json!({"app": "web"}));
    let selecting = || names(selectors.leases_selecting(&web));
    let web_lease = || lease("web", "prod", json!({"matchLabels": {"app": "web"}}));
    listed(&selectors, [web_lease()]);
    assert_eq!(selecting(), ["prod/web"]);

    selectors.follow(&watcher::Event::Apply(lease(
        "web",
        "prod",
        json!({"matchLabels": {"app": "api"}}),
    )));
    assert!(selecting().is_empty(), "the new selector replaced the old one's filing");
    selectors.follow(&watcher::Event::Apply(web_lease()));
    assert_eq!(selecting(), ["prod/web"]);
    selectors.follow(&watcher::Event::Apply(lease("web", "prod", json!({}))));
    assert!(selecting().is_empty(), "a spec made invalid selects nothing");
    selectors.follow(&watcher::Event::Apply(web_lease()));
    selectors.follow(&watcher::Event::Delete(web_lease()));
    assert!(selecting().is_empty(), "deleted");

    selectors.follow(&watcher::Event::Apply(web_lease()));
    selectors.follow(&watcher::Event::Init);
    selectors.follow(&watcher::Event::InitApply(lease(
        "other",
        "prod",
        json!({"matchLabels": {"app": "web"}}),
    )));
    assert_eq!(selecting(), ["prod/web"], "the old index answers during a re-list");
    selectors.follow(&watcher::Event::InitDone);
    assert_eq!(selecting(), ["prod/other"], "a lease missing from the re-list is gone");
    assert!(
        lock(&selectors.0).live["prod"].filed["app"]["web"] == HashSet::from(["other".to_string()]),
        "nothing of the replaced index is left"
    );
}

/// A lease's candidates from the label index are exactly the pods of its
/// namespace its selector matches (the scan of every pod they replace),
/// for selectors with and without a required label, across label changes,
/// deletes and a re-list. Planted: an `Apply` that unfiled the object but
/// did not file it again failed here (`app=web after moves`: the new pod
/// `web-2` was not found) and in `selectors_follow_the_lease_watch`.
#[test]
fn candidates_from_the_index_are_the_pods_a_selector_matches() {
    let (cache, mut writer) = pod_cache();
    let selectors: Vec<Selector> = [
        json!({"matchLabels": {"app": "web"}}),
        json!({"matchLabels": {"app": "web", "track": "canary"}}),
        json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["web", "api"]}]}),
        json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["api"]}]}),
        json!({"matchExpressions": [{"key": "track", "operator": "Exists"}]}),
        json!({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["web"]}]}),
    ]
    .into_iter()
    .map(|s| {
        Selector::try_from(leasehold_kubernetes::api::client::object_from_value::<LabelSelector>(&s).unwrap()).unwrap()
    })
    .collect();
    let check = |when: &str, pods: &[Pod]| {
        for selector in &selectors {
            let mut found: Vec<String> = cache
                .selected("prod", selector)
                .iter()
                .map(|p| p.name.clone())
                .collect();
            found.sort();
            let mut scanned: Vec<String> = pods
                .iter()
                .filter(|p| p.metadata.namespace.as_deref() == Some("prod") && selector.matches(p.labels()))
                .map(|p| p.name_any())
                .collect();
            scanned.sort();
            assert_eq!(found, scanned, "{selector} {when}");
        }
    };
    let mut pods = vec![
        pod("web-0", "prod", json!({"app": "web"})),
        pod("web-1", "prod", json!({"app": "web", "track": "canary"})),
        pod("api-0", "prod", json!({"app": "api"})),
        pod("plain", "prod", json!({})),
        pod("web-0", "staging", json!({"app": "web"})),
    ];
    writer.apply_watcher_event(&watcher::Event::Init);
    for pod in &pods {
        writer.apply_watcher_event(&watcher::Event::InitApply(pod.clone()));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    check("after the list", &pods);

    pods[0] = pod("web-0", "prod", json!({"app": "api", "track": "stable"}));
    writer.apply_watcher_event(&watcher::Event::Apply(pods[0].clone()));
    let gone = pods.remove(1);
    writer.apply_watcher_event(&watcher::Event::Delete(gone));
    pods.push(pod("web-2", "prod", json!({"app": "web"})));
    writer.apply_watcher_event(&watcher::Event::Apply(pods[4].clone()));
    check("after moves", &pods);

    pods.truncate(2);
    writer.apply_watcher_event(&watcher::Event::Init);
    for pod in &pods {
        writer.apply_watcher_event(&watcher::Event::InitApply(pod.clone()));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    check("after a re-list", &pods);
}
