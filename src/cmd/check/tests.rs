//! `leasehold check` against a fake API server that answers by path from a
//! described cluster, records every request, and checks that each access
//! review asks about a permission the operator's RBAC data grants.

use std::sync::Mutex;

use clap::{CommandFactory, Parser};
use k8s_openapi::ByteString;
use serde_json::{Value, json};

use super::*;
use crate::api::contract::{ENV_CLUSTER_NAME, ENV_REVISION};
use crate::cmd::{Cli, Command};
use crate::rbac::RequestAttributes;
use crate::testing::api::{self, mock_client};

/// The cluster the fake API server shows.
#[derive(Default)]
struct Cluster {
    crd: Option<Value>,
    webhook: Option<Value>,
    secret_ca: Option<&'static str>,
    services: Vec<(&'static str, &'static str)>,
    /// Ready endpoints behind each Service.
    ready_endpoints: usize,
    /// (group, resource, verb) the account may not do.
    denied: Vec<(&'static str, &'static str, &'static str)>,
    /// (user, resource, verb) a ServiceAccount may not do, for the sidecar's reviews.
    sidecar_denied: Vec<(&'static str, &'static str, &'static str)>,
    /// Whether this account may create SubjectAccessReviews.
    reviews_forbidden: bool,
    leases: Vec<Value>,
    pods: Vec<Value>,
    deployments: Vec<Value>,
    /// The operator Deployments (any namespace), found by their labels.
    operators: Vec<Value>,
    /// The operator's namespace, webhook configuration and Secret
    /// [default: a release called leasehold in leasehold-system].
    names: Option<(&'static str, &'static str, &'static str)>,
    /// Requests nobody expected, and access reviews the operator's rules do not grant.
    unexpected: Vec<String>,
    requests: Vec<String>,
}

fn base64(text: &str) -> Value {
    serde_json::to_value(ByteString(text.as_bytes().to_vec())).unwrap()
}

/// An access review's permission as RBAC sees it, and the user it names.
fn review_of(body: &Value) -> (RequestAttributes, String) {
    let attributes = &body["spec"]["resourceAttributes"];
    let text = |k: &str| attributes[k].as_str().unwrap_or_default().to_string();
    let resource = match text("subresource").as_str() {
        "" => text("resource"),
        sub => format!("{}/{sub}", text("resource")),
    };
    let request = RequestAttributes {
        api_group: text("group"),
        resource,
        name: attributes["name"].as_str().map(str::to_string),
        verb: Box::leak(text("verb").into_boxed_str()),
    };
    (request, body["spec"]["user"].as_str().unwrap_or_default().to_string())
}

fn not_found() -> (u16, Value) {
    (404, api::status(404, "NotFound", "not found"))
}

/// The query's labelSelector, decoded.
fn label_selector(query: &str) -> String {
    query
        .split('&')
        .find_map(|p| p.strip_prefix("labelSelector="))
        .unwrap_or_default()
        .replace("%3D", "=")
        .replace("%2C", ",")
        .replace("%2F", "/")
}

/// An operator Deployment as the chart renders it for `release` in `namespace`.
fn operator(namespace: &str, release: &str, webhook_configuration: &str, secret: &str) -> Value {
    let name = match release {
        "leasehold" => "leasehold-operator".to_string(),
        other => format!("{other}-leasehold-operator"),
    };
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": name, "namespace": namespace,
                        "labels": {"app.kubernetes.io/name": "leasehold", "app.kubernetes.io/instance": release,
                                   "app.kubernetes.io/component": "operator"}},
           "spec": {"selector": {"matchLabels": {}},
                    "template": {"spec": {"containers": [{"name": "operator", "image": "ghcr.io/leasehold/leasehold:0.1.0",
                        "env": [{"name": "LEASEHOLD_WEBHOOK_CONFIGURATION", "value": webhook_configuration},
                                {"name": "LEASEHOLD_WEBHOOK_SECRET", "value": secret}]}]}}}})
}

fn labels_match(selector: &str, pod: &Value) -> bool {
    selector.split(',').all(|term| {
        let (key, value) = term.split_once('=').unwrap();
        pod["metadata"]["labels"][key] == json!(value)
    })
}

impl Cluster {
    fn answer(&mut self, method: &str, path: &str, query: &str, body: Value) -> (u16, Value) {
        self.requests.push(format!("{method} {path}"));
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let found = |v: Option<Value>| v.map_or_else(not_found, |v| (200, v));
        let (operator_namespace, webhook_configuration, webhook_secret) =
            self.names
                .unwrap_or(("leasehold-system", WEBHOOK_CONFIGURATION, DEFAULT_WEBHOOK_SECRET));
        match (method, parts.as_slice()) {
            ("GET", ["apis", "apps", "v1", "deployments"]) => {
                let selector = label_selector(query);
                let items: Vec<&Value> = self.operators.iter().filter(|d| labels_match(&selector, d)).collect();
                (200, json!({"apiVersion": "apps/v1", "kind": "DeploymentList", "metadata": {}, "items": items}))
            }
            ("GET", ["apis", "apiextensions.k8s.io", "v1", "customresourcedefinitions", "distributedleases.leasehold.dev"]) => {
                found(self.crd.clone())
            }
            ("GET", ["apis", "admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", name])
                if *name == webhook_configuration =>
            {
                found(self.webhook.clone())
            }
            ("GET", ["api", "v1", "namespaces", namespace, "secrets", name])
                if *namespace == operator_namespace && *name == webhook_secret =>
            {
                found(self.secret_ca.map(|ca| {
                    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": {"ca.crt": base64(ca)}})
                }))
            }
            ("GET", ["api", "v1", "namespaces", namespace, "services", name]) => {
                let exists = self.services.contains(&(*namespace, *name));
                found(exists.then(|| json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace}})))
            }
            ("GET", ["apis", "discovery.k8s.io", "v1", "namespaces", _, "endpointslices"]) => {
                assert!(query.contains("labelSelector=kubernetes.io%2Fservice-name%3D"), "{query}");
                let endpoints: Vec<Value> = (0..self.ready_endpoints)
                    .map(|i| json!({"addresses": [format!("10.0.0.{i}")], "conditions": {"ready": true}}))
                    .chain([json!({"addresses": ["10.0.0.99"], "conditions": {"ready": false}})])
                    .collect();
                let slice = json!({"addressType": "IPv4", "metadata": {"name": "s"}, "endpoints": endpoints});
                (200, json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList", "metadata": {}, "items": [slice]}))
            }
            ("POST", ["apis", "authorization.k8s.io", "v1", "selfsubjectaccessreviews"]) => {
                let (request, _) = review_of(&body);
                if !crate::operator::rbac::allows(&request) {
                    self.unexpected.push(format!("review of {request:?}, which the operator's rules do not grant"));
                }
                let allowed = !self
                    .denied
                    .iter()
                    .any(|(g, r, v)| *g == request.api_group && *r == request.resource && *v == request.verb);
                let mut answer = body.clone();
                answer["status"] = json!({"allowed": allowed});
                (201, answer)
            }
            ("POST", ["apis", "authorization.k8s.io", "v1", "subjectaccessreviews"]) => {
                if self.reviews_forbidden {
                    return (403, api::status(403, "Forbidden", "cannot create subjectaccessreviews"));
                }
                let (request, user) = review_of(&body);
                let namespace = body["spec"]["resourceAttributes"]["namespace"].as_str().unwrap_or_default();
                let groups = &body["spec"]["groups"];
                if !crate::rbac::grants(crate::sidecar::rbac::RULES, &request)
                    || !user.starts_with(&format!("system:serviceaccount:{namespace}:"))
                    || !groups
                        .as_array()
                        .is_some_and(|g| g.contains(&json!(format!("system:serviceaccounts:{namespace}"))))
                {
                    self.unexpected.push(format!("sidecar review of {request:?} as {user} with {groups}"));
                }
                let allowed = !self
                    .sidecar_denied
                    .iter()
                    .any(|(u, r, v)| *u == user && *r == request.resource && *v == request.verb);
                let mut answer = body.clone();
                answer["status"] = json!({"allowed": allowed});
                (201, answer)
            }
            ("GET", ["apis", "leasehold.dev", "v1alpha1", "distributedleases"]) => (
                200,
                json!({"apiVersion": "leasehold.dev/v1alpha1", "kind": "DistributedLeaseList", "metadata": {}, "items": self.leases}),
            ),
            ("GET", ["api", "v1", "namespaces", namespace, "pods"]) => {
                let selector = label_selector(query);
                let items: Vec<&Value> = (self.pods.iter())
                    .filter(|p| p["metadata"]["namespace"] == json!(namespace) && labels_match(&selector, p))
                    .collect();
                (200, json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}))
            }
            ("GET", ["apis", "apps", "v1", "namespaces", "prod", "deployments", name]) => {
                found(self.deployments.iter().find(|d| d["metadata"]["name"] == json!(name)).cloned())
            }
            _ => {
                self.unexpected.push(format!("{method} {path}?{query}"));
                not_found()
            }
        }
    }
}

type Shared = Arc<Mutex<Cluster>>;

async fn check_against(cluster: Cluster) -> (Report, Shared) {
    check_with(cluster, &[]).await
}

async fn check_with(cluster: Cluster, flags: &[&str]) -> (Report, Shared) {
    let cluster = Arc::new(Mutex::new(cluster));
    let (client, server) = mock_client("default");
    let serving = cluster.clone();
    server.serve(move |request| {
        let answer = serving.lock().unwrap().answer(
            &request.method,
            &request.path,
            request.raw_query(),
            request.body.clone(),
        );
        Some(answer)
    });
    let args = check_args(flags);
    let report = check(client, &args).await;
    (report, cluster)
}

fn check_args(args: &[&str]) -> Args {
    let argv = ["leasehold", "check"].iter().chain(args);
    match Cli::try_parse_from(argv).unwrap().command {
        Command::Check(args) => args,
        other => panic!("parsed {other:?}"),
    }
}

fn webhook(ca: &str, service: (&str, &str)) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_CONFIGURATION},
        "webhooks": [{"name": "inject.leasehold.dev", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                      "clientConfig": {"caBundle": base64(ca),
                                       "service": {"namespace": service.0, "name": service.1, "path": "/inject"}}}],
    })
}

fn lease(name: &str, spec: Value, status: Option<Value>) -> Value {
    let mut full = json!({
        "store": {"spanner": {"database": "projects/p/instances/i/databases/d"}},
        "selector": {"matchLabels": {"app": name}},
    });
    for (k, v) in spec.as_object().unwrap() {
        full[k] = v.clone();
    }
    let mut lease = json!({
        "apiVersion": "leasehold.dev/v1alpha1", "kind": "DistributedLease",
        "metadata": {"name": name, "namespace": "prod"}, "spec": full,
    });
    if let Some(status) = status {
        lease["status"] = status;
    }
    lease
}

fn pod(name: &str, app: &str, replica_set: Option<(&str, &str)>) -> Value {
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": name, "namespace": "prod", "labels": {"app": app}},
                         "spec": {"containers": [{"name": "app"}],
                                  "initContainers": [{"name": "leasehold", "restartPolicy": "Always"}],
                                  "serviceAccountName": app}});
    if let Some((rs, hash)) = replica_set {
        pod["metadata"]["labels"]["pod-template-hash"] = json!(hash);
        pod["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs, "uid": "u", "controller": true}]);
    }
    pod
}

fn healthy() -> Cluster {
    Cluster {
        crd: Some(serde_json::to_value(DistributedLease::crd()).unwrap()),
        webhook: Some(webhook("CA-1", ("leasehold-system", "leasehold-webhook"))),
        secret_ca: Some("CA-1"),
        services: vec![("leasehold-system", "leasehold-webhook")],
        ready_endpoints: 2,
        leases: vec![lease(
            "web",
            json!({}),
            Some(
                json!({"conditions": [{"type": "StoreReady", "status": "True", "reason": "TableReady",
                                        "message": "ok", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}),
            ),
        )],
        pods: vec![pod("web-0", "web", None), pod("web-1", "web", None)],
        operators: vec![operator(
            "leasehold-system",
            "leasehold",
            WEBHOOK_CONFIGURATION,
            DEFAULT_WEBHOOK_SECRET,
        )],
        ..Cluster::default()
    }
}

fn messages(report: &Report, severity: Severity) -> Vec<String> {
    report
        .0
        .iter()
        .filter(|f| f.severity == severity)
        .map(|f| f.message.clone())
        .collect()
}

#[tokio::test]
async fn a_healthy_install_reports_only_ok() {
    let (report, cluster) = check_against(healthy()).await;
    assert_eq!(report.errors(), 0, "{report:#?}");
    assert_eq!(messages(&report, Severity::Warning), Vec::<String>::new());
    let ok = messages(&report, Severity::Ok).join("\n");
    for expected in [
        "CRD distributedleases.leasehold.dev is installed and matches this leasehold",
        "webhook inject.leasehold.dev: caBundle is set",
        "Service leasehold-system/leasehold-webhook has 2 ready endpoint(s)",
        "this account has every permission the operator needs",
        "DistributedLease prod/web: 2 candidate(s)",
        "ServiceAccount prod/web (candidates of prod/web) has the sidecar's permissions",
    ] {
        assert!(ok.contains(expected), "{expected:?} missing from:\n{ok}");
    }
    let cluster = cluster.lock().unwrap();
    assert_eq!(cluster.unexpected, Vec::<String>::new());
    let reviews = cluster
        .requests
        .iter()
        .filter(|r| r.contains("selfsubjectaccessreviews"))
        .count();
    let verbs: usize = RULES
        .iter()
        .chain(NAMESPACED_RULES)
        .map(|r| r.resources.len() * r.verbs.len())
        .sum();
    assert_eq!(reviews, verbs, "one review per verb of every rule");
    let sidecar_reviews = cluster
        .requests
        .iter()
        .filter(|r| r.ends_with("/subjectaccessreviews"))
        .count();
    let sidecar_verbs: usize = (crate::sidecar::rbac::RULES.iter())
        .map(|r| r.resources.len() * r.verbs.len())
        .sum();
    assert_eq!(
        sidecar_reviews, sidecar_verbs,
        "one account (both pods run as it), one review per verb"
    );
}

/// Candidates running as an account without the sidecar's Role are an
/// error naming the account, its leases, what it lacks and the chart value
/// that binds it; an account that has it is reported ok.
#[tokio::test]
async fn a_candidate_account_without_the_sidecar_role_is_named() {
    let mut cluster = healthy();
    cluster.leases.push(lease("jobs", json!({}), None));
    let mut unbound = pod("jobs-0", "jobs", None);
    unbound["spec"]["serviceAccountName"] = json!("default");
    let mut defaulted = pod("jobs-1", "jobs", None);
    defaulted["spec"].as_object_mut().unwrap().remove("serviceAccountName");
    cluster.pods.extend([unbound, defaulted]);
    cluster.sidecar_denied = vec![
        ("system:serviceaccount:prod:default", "pods/status", "patch"),
        ("system:serviceaccount:prod:default", "distributedleases", "watch"),
    ];
    let (report, cluster) = check_against(cluster).await;
    assert_eq!(
        messages(&report, Severity::Error),
        [
            "ServiceAccount prod/default, which candidates of prod/jobs run as, lacks the sidecar's permissions: \
          patch pods/status, watch leasehold.dev/distributedleases; bind the sidecar Role to it (chart: --set \
          'sidecar.rbac.namespaces.prod={default}' with the namespace's other accounts; see docs/rbac-sidecar.md)"
        ]
    );
    let ok = messages(&report, Severity::Ok).join("\n");
    assert!(
        ok.contains("ServiceAccount prod/web (candidates of prod/web) has the sidecar's permissions"),
        "{ok}"
    );
    assert_eq!(cluster.lock().unwrap().unexpected, Vec::<String>::new());
}

#[tokio::test]
async fn a_check_that_may_not_review_others_says_so() {
    let mut cluster = healthy();
    cluster.reviews_forbidden = true;
    let (report, _) = check_against(cluster).await;
    assert_eq!(report.errors(), 0, "{report:#?}");
    let warnings = messages(&report, Severity::Warning).join("\n");
    assert!(
        warnings.contains("cannot review the sidecar's RBAC (SubjectAccessReview)"),
        "{warnings}"
    );
}

#[tokio::test]
async fn every_problem_is_named_in_plain_words() {
    let mut cluster = healthy();
    // An older CRD: the lockName rule at spec level is missing.
    let mut old_crd = serde_json::to_value(DistributedLease::crd()).unwrap();
    old_crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["x-kubernetes-validations"]
        .as_array_mut()
        .unwrap()
        .pop();
    cluster.crd = Some(old_crd);
    cluster.webhook = Some(webhook("CA-OLD", ("leasehold-system", "leasehold-webhook")));
    cluster.services.clear();
    cluster.denied = vec![("coordination.k8s.io", "leases", "update"), ("", "pods", "watch")];
    let ready = json!({"type": "StoreReady", "status": "False", "reason": "StoreUnavailable",
                       "message": "store projects/p/instances/i/databases/d: deadline exceeded",
                       "lastTransitionTime": "2026-01-01T00:00:00Z"});
    cluster.leases = vec![
        lease("lonely", json!({}), None),
        lease("gated", json!({"publishing": {"readinessGate": true}}), None),
        lease("down", json!({}), Some(json!({"conditions": [ready]}))),
        lease("bad", json!({"retryPeriod": "10s"}), None),
        lease("bare", json!({}), None),
    ];
    // bare-0 was created while the webhook was down: no sidecar.
    let mut uninjected = pod("bare-0", "bare", None);
    uninjected["spec"]["initContainers"] = json!([]);
    cluster.pods = vec![
        pod("gated-7d9f-a", "gated", Some(("gated-7d9f", "7d9f"))),
        pod("down-0", "down", None),
        uninjected,
    ];
    cluster.deployments = vec![json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "gated", "namespace": "prod"},
        "spec": {"replicas": 3, "strategy": {"rollingUpdate": {"maxUnavailable": 2, "maxSurge": 1}},
                 "selector": {"matchLabels": {"app": "gated"}}, "template": {}},
    })];
    let (report, cluster) = check_against(cluster).await;
    let errors = messages(&report, Severity::Error).join("\n");
    let warnings = messages(&report, Severity::Warning).join("\n");
    for expected in [
        "CRD distributedleases.leasehold.dev differs from this leasehold's",
        "webhook inject.leasehold.dev: caBundle is stale: it is not the CA in Secret leasehold-system/leasehold-webhook-tls",
        "webhook inject.leasehold.dev: Service leasehold-system/leasehold-webhook is missing",
        "lacks permissions the operator needs: watch pods, update coordination.k8s.io/leases",
        "DistributedLease prod/down: its store is not usable (StoreUnavailable): store projects/p/instances/i/databases/d: deadline exceeded",
        "DistributedLease prod/bad is invalid: spec.retryPeriod (10s) must be shorter than renewDeadline (10s)",
    ] {
        assert!(errors.contains(expected), "{expected:?} missing from errors:\n{errors}");
    }
    for expected in [
        "DistributedLease prod/lonely has no candidates: no pod in prod matches the selector app=lonely",
        "DistributedLease prod/gated (readiness gate): deployment gated: maxUnavailable resolves to 2 of 3 replicas",
        "DistributedLease prod/gated (readiness gate): deployment gated: only the leader of its 3 replicas is ever Ready, so each rollout turns Progressing=False (ProgressDeadlineExceeded) after progressDeadlineSeconds (600s)",
        "DistributedLease prod/bare: candidate(s) without a leasehold sidecar never campaign: bare-0",
    ] {
        assert!(
            warnings.contains(expected),
            "{expected:?} missing from warnings:\n{warnings}"
        );
    }
    assert_eq!(report.errors(), 6, "{report:#?}");
    assert_eq!(cluster.lock().unwrap().unexpected, Vec::<String>::new());
}

/// A lease on the Kubernetes store: its candidates' account is reviewed for
/// the sidecar's rules, Lease verbs among them (one list of rules,
/// `sidecar::rbac::RULES`), and a missing Lease verb is an error naming the
/// account and the verbs.
#[tokio::test]
async fn the_candidates_of_a_kubernetes_lease_need_the_sidecars_lease_verbs() {
    let kube_lease = || lease("kube", json!({"store": {"kubernetes": {}}}), None);
    let candidate = |name: &str| {
        let mut pod = pod(name, "kube", None);
        pod["spec"]["serviceAccountName"] = json!("kube-app");
        pod
    };
    let mut cluster = healthy();
    cluster.leases = vec![kube_lease()];
    cluster.pods = vec![candidate("kube-0"), candidate("kube-1")];
    let (report, shared) = check_against(cluster).await;
    assert_eq!(report.errors(), 0, "{report:#?}");
    assert!(
        messages(&report, Severity::Ok).contains(&"DistributedLease prod/kube: 2 candidate(s)".to_string()),
        "{report:#?}"
    );
    assert_eq!(shared.lock().unwrap().unexpected, Vec::<String>::new());

    let mut cluster = healthy();
    cluster.leases = vec![kube_lease()];
    cluster.pods = vec![candidate("kube-0")];
    let account = "system:serviceaccount:prod:kube-app";
    cluster.sidecar_denied = vec![(account, "leases", "watch"), (account, "leases", "update")];
    let (report, _) = check_against(cluster).await;
    let errors = messages(&report, Severity::Error).join("\n");
    assert!(
        errors.contains(
            "ServiceAccount prod/kube-app, which candidates of prod/kube run as, lacks the sidecar's permissions"
        ) && errors.contains("watch coordination.k8s.io/leases")
            && errors.contains("update coordination.k8s.io/leases"),
        "{errors}"
    );
    assert_eq!(report.errors(), 1, "{report:#?}");
}

/// A deleted CRD lingers while DistributedLeases (and their finalizers)
/// remain; leases cannot be created meanwhile, so it is an error.
#[tokio::test]
async fn a_crd_being_deleted_is_an_error() {
    let mut cluster = healthy();
    if let Some(crd) = cluster.crd.as_mut() {
        crd["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    }
    let (report, _) = check_against(cluster).await;
    let errors = messages(&report, Severity::Error).join("\n");
    assert!(
        errors.contains("CRD distributedleases.leasehold.dev is being deleted"),
        "{errors}"
    );
}

#[tokio::test]
async fn a_missing_crd_and_webhook_say_how_to_install_them() {
    let mut cluster = healthy();
    cluster.crd = None;
    cluster.webhook = None;
    let (report, cluster) = check_against(cluster).await;
    let errors = messages(&report, Severity::Error).join("\n");
    assert!(
        errors.contains("CRD distributedleases.leasehold.dev is not installed: install the chart or apply crds/distributedlease.yaml"),
        "{errors}"
    );
    let warnings = messages(&report, Severity::Warning).join("\n");
    assert!(
        warnings.contains("webhook configuration leasehold-sidecar-injector is missing"),
        "{warnings}"
    );
    let cluster = cluster.lock().unwrap();
    assert!(
        !cluster.requests.iter().any(|r| r.contains("/apis/leasehold.dev/")),
        "no lease list without the CRD: {:?}",
        cluster.requests
    );
    assert_eq!(cluster.unexpected, Vec::<String>::new());
}

#[tokio::test]
async fn a_webhook_without_a_ready_operator_pod_is_not_reachable() {
    let mut cluster = healthy();
    cluster.ready_endpoints = 0;
    let (report, cluster) = check_against(cluster).await;
    let errors = messages(&report, Severity::Error).join("\n");
    assert!(
        errors.contains("webhook inject.leasehold.dev: no ready pod serves Service leasehold-system/leasehold-webhook"),
        "{errors}"
    );
    assert_eq!(report.errors(), 1, "{report:#?}");
    assert_eq!(cluster.lock().unwrap().unexpected, Vec::<String>::new());
}

#[test]
fn check_flags_come_from_the_environment_and_default_to_the_operators_names() {
    let cli = Cli::command();
    let check = cli.find_subcommand("check").expect("check subcommand");
    for arg in check.get_arguments() {
        if ["help", "version"].contains(&arg.get_id().as_str()) {
            continue;
        }
        let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
        assert!(
            env.is_some_and(|e| e.starts_with("LEASEHOLD_") || e == "KUBECONFIG"),
            "--{}",
            arg.get_id()
        );
    }
    let operator = match Cli::try_parse_from(["leasehold", "operator"]).unwrap().command {
        Command::Operator(args) => args,
        other => panic!("parsed {other:?}"),
    };
    let install = Install::of(&check_args(&[]), None);
    assert_eq!(install.webhook_secret, operator.webhook.webhook_secret);
    assert_eq!(install.webhook_configuration, operator.webhook.webhook_configuration);
}

/// With release `other` in namespace `ops`, the names come from its
/// operator Deployment (found by its labels), not from the defaults.
#[tokio::test]
async fn the_install_is_found_by_its_labels_whatever_the_release() {
    let (configuration, secret) = ("other-leasehold-sidecar-injector", "other-leasehold-webhook-tls");
    let mut webhook = webhook("CA-1", ("ops", "other-leasehold-webhook"));
    webhook["metadata"]["name"] = json!(configuration);
    let cluster = Cluster {
        operators: vec![operator("ops", "other", configuration, secret)],
        names: Some(("ops", configuration, secret)),
        webhook: Some(webhook),
        services: vec![("ops", "other-leasehold-webhook")],
        ..healthy()
    };
    let (report, cluster) = check_against(cluster).await;
    assert_eq!(report.errors(), 0, "{report:#?}");
    assert_eq!(messages(&report, Severity::Warning), Vec::<String>::new());
    let ok = messages(&report, Severity::Ok).join("\n");
    assert!(
        ok.contains(
            "operator Deployment ops/other-leasehold-operator (release other, image ghcr.io/leasehold/leasehold:0.1.0)"
        ),
        "{ok}"
    );
    let cluster = cluster.lock().unwrap();
    assert_eq!(cluster.unexpected, Vec::<String>::new());
    assert!(
        cluster
            .requests
            .contains(&format!("GET /api/v1/namespaces/ops/secrets/{secret}")),
        "{:#?}",
        cluster.requests
    );
}

/// Two installs and no --instance: an error naming both and the flag;
/// with --instance, the one it names.
#[tokio::test]
async fn two_installs_need_instance() {
    let two = || Cluster {
        operators: vec![
            operator(
                "leasehold-system",
                "leasehold",
                WEBHOOK_CONFIGURATION,
                DEFAULT_WEBHOOK_SECRET,
            ),
            operator(
                "ops",
                "other",
                "other-leasehold-sidecar-injector",
                "other-leasehold-webhook-tls",
            ),
        ],
        ..healthy()
    };
    let (report, _) = check_against(two()).await;
    let errors = messages(&report, Severity::Error);
    assert!(
        errors.iter().any(|e| e.starts_with(
            "2 operator Deployments: Deployment leasehold-system/leasehold-operator \
             (release leasehold), Deployment ops/other-leasehold-operator (release other); pick one with --instance"
        )),
        "{errors:#?}"
    );
    let (configuration, secret) = ("other-leasehold-sidecar-injector", "other-leasehold-webhook-tls");
    let mut webhook = webhook("CA-1", ("ops", "other-leasehold-webhook"));
    webhook["metadata"]["name"] = json!(configuration);
    let other = Cluster {
        names: Some(("ops", configuration, secret)),
        webhook: Some(webhook),
        services: vec![("ops", "other-leasehold-webhook")],
        ..two()
    };
    let (report, cluster) = check_with(other, &["--instance", "other"]).await;
    assert_eq!(report.errors(), 0, "{report:#?}");
    assert_eq!(cluster.lock().unwrap().unexpected, Vec::<String>::new());
}

/// `-o json`: the findings as a list of {severity, message}.
#[tokio::test]
async fn findings_serialize_for_programs() {
    let (report, _) = check_against(healthy()).await;
    let json = serde_json::to_value(&report.0).unwrap();
    assert_eq!(json[0]["severity"], json!("ok"), "{json}");
    assert!(json[0]["message"].is_string(), "{json}");
    let parsed = check_args(&["-o", "json", "-n", "prod", "--operator-namespace", "ops"]);
    assert_eq!(
        (
            parsed.output,
            parsed.namespace.as_deref(),
            parsed.operator_namespace.as_deref()
        ),
        (Output::Json, Some("prod"), Some("ops"))
    );
    assert_eq!(
        check_args(&["--lease-namespace", "prod"]).namespace.as_deref(),
        Some("prod")
    );
}

/// An operator pod of the release `leasehold` whose only container waits
/// with `reason` for `image`.
fn operator_pod(image: &str, reason: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "leasehold-operator-x", "namespace": "leasehold-system",
                        "labels": {"app.kubernetes.io/name": "leasehold", "app.kubernetes.io/instance": "leasehold",
                                   "app.kubernetes.io/component": "operator"}},
           "spec": {"containers": [{"name": "operator", "image": image}]},
           "status": {"containerStatuses": [{"name": "operator", "image": image, "imageID": "", "ready": false,
                                             "restartCount": 0, "state": {"waiting": {"reason": reason}}}]}})
}

#[tokio::test]
async fn an_operator_that_cannot_pull_the_unpublished_default_image_is_told_to_build_it() {
    let mut cluster = healthy();
    cluster.pods.push(operator_pod(DEFAULT_IMAGE, "ImagePullBackOff"));
    let (report, _) = check_against(cluster).await;
    let errors = messages(&report, Severity::Error);
    assert_eq!(errors.len(), 1, "{report:#?}");
    assert!(
        errors[0].starts_with(&format!(
            "operator pod leasehold-system/leasehold-operator-x cannot pull image {DEFAULT_IMAGE} (ImagePullBackOff); \
             ghcr.io/leasehold/leasehold is not published: build the image from the Dockerfile"
        )),
        "{errors:?}"
    );
    // Another image gets the registry's hint; a running pod none.
    let mut cluster = healthy();
    cluster
        .pods
        .push(operator_pod("registry.example/leasehold:1", "ErrImagePull"));
    let (report, _) = check_against(cluster).await;
    let errors = messages(&report, Severity::Error);
    assert!(
        errors[0].ends_with("(ErrImagePull); check the image name and the registry's credentials (imagePullSecrets)"),
        "{errors:?}"
    );
    let mut cluster = healthy();
    cluster.pods.push(operator_pod(DEFAULT_IMAGE, "ContainerCreating"));
    let (report, cluster) = check_against(cluster).await;
    assert_eq!(report.errors(), 0, "{report:#?}");
    assert_eq!(cluster.lock().unwrap().unexpected, Vec::<String>::new());
}

#[tokio::test]
async fn a_release_asked_for_by_name_that_is_not_installed_is_an_error() {
    let mut cluster = healthy();
    cluster.operators.clear();
    let (report, _) = check_with(cluster, &["--instance", "other"]).await;
    let errors = messages(&report, Severity::Error);
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("no operator Deployment of release other (labelled")),
        "{report:#?}"
    );
}

/// Clusters sharing a lock (docs/multi-cluster.md): each way it cannot work
/// is named, and a setup that works draws no warning.
#[tokio::test]
async fn sharing_a_lock_across_clusters_warns_where_it_cannot_work() {
    let named = |cluster: Option<&str>| {
        let mut operator = operator(
            "leasehold-system",
            "leasehold",
            WEBHOOK_CONFIGURATION,
            DEFAULT_WEBHOOK_SECRET,
        );
        if let Some(name) = cluster {
            let env = &mut operator["spec"]["template"]["spec"]["containers"][0]["env"];
            env.as_array_mut()
                .unwrap()
                .push(json!({"name": ENV_CLUSTER_NAME, "value": name}));
        }
        operator
    };
    let with_holder = |holder: &str| Some(json!({"holder": holder, "conditions": []}));
    let pods = || {
        let mut web = pod("web-0", "web", None);
        web["metadata"]["uid"] = json!("uid-0");
        vec![web, pod("jobs-0", "jobs", None)]
    };
    let warnings = |cluster: Option<&'static str>, leases: Vec<Value>| async move {
        let cluster = Cluster {
            operators: vec![named(cluster)],
            leases,
            pods: pods(),
            ..healthy()
        };
        let (report, _) = check_against(cluster).await;
        messages(&report, Severity::Warning).join("\n")
    };

    let kubernetes = lease(
        "jobs",
        json!({"lockName": "shared/jobs", "store": {"kubernetes": {}}}),
        None,
    );
    let seen = warnings(Some("west"), vec![kubernetes]).await;
    assert!(
        seen.contains("DistributedLease prod/jobs: spec.lockName \"shared/jobs\" on the Kubernetes store names a Lease in this cluster only"),
        "{seen}"
    );

    let shared = || lease("web", json!({"lockName": "shared/web"}), None);
    let seen = warnings(None, vec![shared()]).await;
    assert!(
        seen.contains("this cluster has no name: set the chart's clusterName"),
        "{seen}"
    );
    let seen = warnings(Some("west"), vec![shared()]).await;
    assert_eq!(seen, "", "a named cluster sharing a lock is how it is meant to work");

    // Ordered by revision: web-0 has none of its own (its ReplicaSet's
    // counts in this cluster only); with LEASEHOLD_REVISION set, no warning.
    let newest = || {
        lease(
            "web",
            json!({"lockName": "shared/web", "leadership": {"prefer": "Newest"}}),
            None,
        )
    };
    let seen = warnings(Some("west"), vec![newest()]).await;
    assert!(
        seen.contains("orders candidates by revision (prefer Newest, versionFence false), but web-0 take theirs from their ReplicaSet"),
        "{seen}"
    );
    let fenced = lease(
        "web",
        json!({"lockName": "shared/web", "leadership": {"versionFence": true}}),
        None,
    );
    assert!(warnings(Some("west"), vec![fenced]).await.contains("versionFence true"));
    let explicit = Cluster {
        operators: vec![named(Some("west"))],
        leases: vec![newest()],
        pods: pods()
            .into_iter()
            .map(|mut pod| {
                pod["spec"]["containers"][0]["env"] = json!([{"name": ENV_REVISION, "value": "12"}]);
                pod
            })
            .collect(),
        ..healthy()
    };
    let (report, _) = check_against(explicit).await;
    assert_eq!(
        messages(&report, Severity::Warning),
        Vec::<String>::new(),
        "explicit revisions"
    );

    let held_by = |holder: &str| lease("web", json!({}), with_holder(holder));
    let seen = warnings(Some("west"), vec![held_by("west/prod/web-9#0a1b2c3d@uid-9")]).await;
    assert!(
        seen.contains(
            "the holder west/prod/web-9#0a1b2c3d@uid-9 names this cluster (west) but is none of its candidate pods"
        ),
        "{seen}"
    );
    let seen = warnings(Some("west"), vec![held_by("west/prod/web-0#0a1b2c3d@uid-7")]).await;
    assert!(
        seen.contains("names this cluster (west)"),
        "same name, another pod UID: {seen}"
    );
    for elsewhere_or_ours in ["west/prod/web-0#0a1b2c3d@uid-0", "east/prod/web-9#0a1b2c3d@uid-9"] {
        let seen = warnings(Some("west"), vec![held_by(elsewhere_or_ours)]).await;
        assert_eq!(seen, "", "{elsewhere_or_ours}");
    }
}

/// A preference no candidate can satisfy is a warning naming it: a
/// priority that is not an integer, and preferred zones no candidate is in.
#[tokio::test]
async fn a_preference_no_candidate_can_satisfy_is_a_warning() {
    let mut cluster = healthy();
    cluster.leases = vec![lease("web", json!({"preferZones": ["zone-a", "zone-b"]}), None)];
    let mut high = pod("web-0", "web", None);
    high["metadata"]["labels"][preference::PRIORITY_KEY] = json!("high");
    high["metadata"]["labels"][preference::ZONE_LABEL] = json!("zone-c");
    cluster.pods = vec![high, pod("web-1", "web", None)];
    let (report, _) = check_against(cluster).await;
    let warnings = messages(&report, Severity::Warning).join("\n");
    for expected in [
        "DistributedLease prod/web: pod web-0: leasehold.dev/priority label \"high\" is not an integer",
        "DistributedLease prod/web: spec.preferZones (zone-a, zone-b) matches no candidate: their \
         topology.kubernetes.io/zone labels are none, zone-c",
    ] {
        assert!(
            warnings.contains(expected),
            "{expected:?} missing from warnings:\n{warnings}"
        );
    }
    // One candidate in a preferred zone and integers everywhere: no warning.
    let mut cluster = healthy();
    cluster.leases = vec![lease("web", json!({"preferZones": ["zone-a"]}), None)];
    let mut in_a = pod("web-0", "web", None);
    in_a["metadata"]["labels"][preference::ZONE_LABEL] = json!("zone-a");
    in_a["metadata"]["annotations"] = json!({preference::PRIORITY_KEY: "-2"});
    cluster.pods = vec![in_a, pod("web-1", "web", None)];
    let (report, _) = check_against(cluster).await;
    assert_eq!(
        messages(&report, Severity::Warning),
        Vec::<String>::new(),
        "{report:#?}"
    );
}
