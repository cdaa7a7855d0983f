//! The cluster under test: where it is, how leasehold is installed on it, and
//! one namespace per test with its diagnostics when the test fails.

use std::future::Future;
use std::net::IpAddr;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use futures::FutureExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::GroupVersionKind;
use kube::discovery::{ApiCapabilities, ApiResource, Scope};
use kube::{Client, Config};
use serde::Deserialize;
use serde_json::{Value, json};

/// What a user without a cluster reads.
pub const HOW_TO_GET_A_CLUSTER: &str = "\
the end-to-end suite needs a disposable Kubernetes cluster (>= 1.30) and the leasehold image in it:
  - with kind: kind create cluster; docker build -t leasehold:dev .; kind load docker-image leasehold:dev;
    then LEASEHOLD_E2E_KUBECONFIG=$HOME/.kube/config LEASEHOLD_E2E_IMAGE=leasehold:dev
    LEASEHOLD_E2E_APP_IMAGE=busybox:1.36 LEASEHOLD_E2E_HOST_IP=<the docker bridge's gateway, e.g. 172.18.0.1>
    (README, \"End-to-end tests\");
  - or LEASEHOLD_KUBERNETES_TOOL=<a test-cluster tool folder> and scripts/test.sh starts one
    (scripts/e2e-cluster.sh says what the folder holds).
The suite creates namespaces and cluster-wide objects there: never point it at a cluster you care about";

/// The release the suite installs, as the README's `helm install` names it.
pub const RELEASE: &str = "leasehold";
pub const RELEASE_NAMESPACE: &str = "leasehold-system";

/// Every test's namespace, one per test. The chart binds the sidecar's RBAC
/// and admission policy in each (`sidecar.rbac.namespaces`), as a user lists
/// the namespaces of their workloads.
pub const TEST_NAMESPACES: &[&str] = &[
    "e2e-install",
    "e2e-install-check",
    "e2e-helm-test",
    "e2e-crd-upgrade",
    "e2e-inject",
    "e2e-inject-gitops",
    "e2e-webhook-down",
    "e2e-publish",
    "e2e-gated",
    "e2e-gated-freeze",
    "e2e-privilege",
    "e2e-privilege-other",
    "e2e-watcher",
    "e2e-fault-kubelet",
    "e2e-fault-partition",
    "e2e-fault-sidecar",
    "e2e-fault-delete",
    "e2e-fault-app",
    "e2e-fault-freeze",
    "e2e-fault-apiserver",
    "e2e-fault-store",
    "e2e-fault-resume",
    "e2e-fault-k8s-sidecar",
    "e2e-fault-k8s-delete",
    "e2e-fault-k8s-app",
    "e2e-fault-k8s-freeze",
    "e2e-fault-k8s-resume",
    "e2e-store-spanner",
    "e2e-store-redis",
    "e2e-store-change",
    "e2e-store-identity",
    "e2e-run",
    "e2e-partitions",
    "e2e-versions",
    // The benchmark's kubernetes part (benches/leasehold/kubernetes.rs).
    "e2e-bench",
    "e2e-status",
    "e2e-monitoring",
    "e2e-monitoring-dark",
    "e2e-timing-risk",
    // Each alert fired by its real fault (alerts.rs).
    "e2e-alert-store",
    "e2e-alert-stalled",
    "e2e-alert-two-claimants",
    "e2e-alert-operator-store",
    "e2e-alert-reconcile",
    "e2e-alert-operator-down",
    // Quiet under ordinary turbulence (turbulence.rs).
    "e2e-turbulence",
    // The two-cluster scenarios' namespace in the first cluster (clusters.rs).
    "e2e-clusters",
    // Steering leadership (steering.rs).
    "e2e-transfer",
    "e2e-transfer-refused",
    "e2e-transfer-target-gone",
    "e2e-prefer-priority",
    "e2e-prefer-zone",
    "e2e-prefer-cut-off",
    "e2e-history-restart",
    // The fenced workload under faults (fenced_workload.rs).
    "e2e-fenced-workload",
];

/// Test namespaces that are not opted in to injection: the injection
/// scenarios opt in themselves, or inject with `leasehold inject`. Every
/// other test namespace carries `leasehold.dev/inject=enabled`, as the
/// README's walkthrough labels its namespace.
const NOT_OPTED_IN: &[&str] = &["e2e-inject", "e2e-inject-gitops"];

/// The suite's settings, from the variables README's "End-to-end tests" names.
#[derive(Clone, Debug)]
pub struct Env {
    pub kubeconfig: PathBuf,
    /// The leasehold image, present in the cluster.
    pub image: String,
    /// The stand-in app: an image with /bin/busybox.
    pub app_image: String,
    /// An address of this machine that pods reach (stores run here).
    pub host_ip: IpAddr,
    /// A command that takes `NAME stop|start|pause|resume` for a part of the
    /// cluster (kube-apiserver, ...), for the fault scenarios.
    pub component: Option<String>,
}

impl Env {
    pub fn from_vars() -> Env {
        let var = |name: &str| {
            std::env::var(name)
                .ok()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| panic!("{name} is not set: {HOW_TO_GET_A_CLUSTER}"))
        };
        let host_ip = var("LEASEHOLD_E2E_HOST_IP");
        Env {
            kubeconfig: var("LEASEHOLD_E2E_KUBECONFIG").into(),
            image: var("LEASEHOLD_E2E_IMAGE"),
            app_image: var("LEASEHOLD_E2E_APP_IMAGE"),
            host_ip: host_ip
                .parse()
                .unwrap_or_else(|e| panic!("LEASEHOLD_E2E_HOST_IP={host_ip}: {e}")),
            component: std::env::var("LEASEHOLD_E2E_COMPONENT").ok().filter(|v| !v.is_empty()),
        }
    }

    pub async fn client(&self) -> Client {
        Client::try_from(self.config().await).expect("a client for the kubeconfig")
    }

    /// The kubeconfig's client configuration.
    pub async fn config(&self) -> Config {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)
            .unwrap_or_else(|e| panic!("reading {}: {e}", self.kubeconfig.display()));
        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .unwrap_or_else(|e| panic!("kubeconfig {}: {e}", self.kubeconfig.display()))
    }

    /// The kubeconfig's configuration acting as `user` in `groups`, with
    /// the pod name a bound ServiceAccount token carries
    /// (`authentication.kubernetes.io/pod-name`, Kubernetes
    /// pkg/serviceaccount/claims.go) when `pod` is given, by impersonation.
    pub async fn impersonating(&self, user: &str, groups: &[&str], pod: Option<&str>) -> Config {
        let mut config = self.config().await;
        config.auth_info.impersonate = Some(user.to_string());
        config.auth_info.impersonate_groups = Some(groups.iter().map(|g| g.to_string()).collect());
        config.auth_info.impersonate_user_extra = pod.map(|pod| {
            std::collections::HashMap::from([(
                "authentication.kubernetes.io/pod-name".to_string(),
                vec![pod.to_string()],
            )])
        });
        config
    }

    /// `kubectl` (the one the project's venv installs) on the cluster.
    pub fn kubectl(&self) -> Command {
        let mut kubectl = Command::new(repo().join(".venv/bin/kubectl"));
        kubectl.env("KUBECONFIG", &self.kubeconfig);
        kubectl
    }

    /// Runs kubectl and returns its stdout; panics with its stderr on failure.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self
            .kubectl()
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running kubectl (scripts/setup-python.sh installs it): {e}"));
        assert!(
            out.status.success(),
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Stops, starts, pauses or resumes a part of the cluster.
    pub fn component(&self, name: &str, action: &str) {
        let command = self.component.as_deref().unwrap_or_else(|| {
            panic!(
                "LEASEHOLD_E2E_COMPONENT is not set: this fault scenario stops parts of the \
                 cluster through it (scripts/e2e-cluster.sh sets it; on kind, point it to a \
                 script that takes NAME stop|start|pause|resume)"
            )
        });
        let status = Command::new("sh")
            .arg("-c")
            .arg(format!("{command} {name} {action}"))
            .status()
            .expect("running LEASEHOLD_E2E_COMPONENT");
        assert!(status.success(), "{command} {name} {action} failed");
    }

    /// The leasehold binary of this tree, as `leasehold check`/`inject` users run it.
    pub fn leasehold(&self) -> Command {
        let mut leasehold = Command::new(env!("CARGO_BIN_EXE_leasehold"));
        leasehold.env("KUBECONFIG", &self.kubeconfig);
        leasehold
    }
}

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Polls `probe` until it gives a value, or fails the test naming `what`.
/// The bounds are generous liveness bounds; timings are the benchmark's.
/// The chart's fencing ValidatingAdmissionPolicy and its binding
/// (`fencing.enabled` and the `more` --set values), and the policy's name.
pub fn rendered_fencing_policy(env: &Env, more: &[String]) -> (Vec<Value>, String) {
    let mut sets = vec!["fencing.enabled=true".to_string()];
    sets.extend_from_slice(more);
    let policy: Vec<Value> = rendered_chart_with(env, &sets)
        .into_iter()
        .filter(|o| {
            o["kind"]
                .as_str()
                .is_some_and(|k| k.starts_with("ValidatingAdmissionPolicy"))
                && o["metadata"]["name"].as_str().is_some_and(|n| n.ends_with("-fencing"))
        })
        .collect();
    assert_eq!(policy.len(), 2, "the chart renders the fencing policy and its binding");
    let name = policy[0]["metadata"]["name"].as_str().unwrap().to_string();
    (policy, name)
}

/// Deletes objects (kind, name) of `env`'s cluster, in `namespace` when
/// given, in order, when dropped, also when a test fails; each delete waits
/// until the object is gone, so a rerun can make it again.
pub struct DeleteOnDrop {
    pub env: Env,
    pub namespace: Option<String>,
    pub objects: Vec<(&'static str, String)>,
}

impl Drop for DeleteOnDrop {
    fn drop(&mut self) {
        for (kind, name) in &self.objects {
            let mut kubectl = self.env.kubectl();
            if let Some(ns) = &self.namespace {
                kubectl.args(["-n", ns]);
            }
            let _ = kubectl
                .args(["delete", kind, name, "--ignore-not-found", "--timeout=120s"])
                .status();
        }
    }
}

/// How often a scenario looks again at what it waits for.
pub const POLL: Duration = Duration::from_millis(200);

pub async fn wait_for<T, F, Fut>(what: &str, within: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(POLL).await;
    }
}

/// The objects of a multi-document YAML text.
pub fn yaml_objects(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).expect("valid YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

/// Server-side apply of objects, as `kubectl apply --server-side` does.
pub async fn apply(client: &Client, objects: &[Value]) {
    for object in objects {
        let (resource, caps) = resource_of(client, object).await;
        let name = object["metadata"]["name"].as_str().expect("metadata.name");
        let api: Api<DynamicObject> = match (caps.scope, object["metadata"]["namespace"].as_str()) {
            (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource),
            (Scope::Namespaced, None) => panic!("{} {name} has no namespace", resource.kind),
            (Scope::Cluster, _) => Api::all_with(client.clone(), &resource),
        };
        api.patch(
            name,
            &PatchParams::apply("leasehold-e2e").force(),
            &Patch::Apply(object),
        )
        .await
        .unwrap_or_else(|e| panic!("applying {} {name}: {e}", resource.kind));
    }
}

async fn resource_of(client: &Client, object: &Value) -> (ApiResource, ApiCapabilities) {
    let api_version = object["apiVersion"].as_str().expect("apiVersion");
    let kind = object["kind"].as_str().expect("kind");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    // A CRD applied a moment ago is served after its Established condition.
    wait_for(
        &format!("the API serves {api_version} {kind}"),
        Duration::from_secs(30),
        || {
            let gvk = gvk.clone();
            async move { kube::discovery::pinned_kind(client, &gvk).await.ok() }
        },
    )
    .await
}

/// The chart rendered by real Helm with the README's install values, plus
/// the image this suite runs and the test namespaces as the sidecar's.
pub fn rendered_chart(env: &Env) -> Vec<Value> {
    rendered_chart_with(env, &[])
}

/// The same with more `--set KEY=VALUE`s, as `helm upgrade --set` adds them.
pub fn rendered_chart_with(env: &Env, more: &[String]) -> Vec<Value> {
    rendered_chart_at(env, &repo().join("charts/leasehold"), more)
}

/// [`rendered_chart_with`] of the chart in `chart` (a changed copy).
pub fn rendered_chart_at(env: &Env, chart: &Path, more: &[String]) -> Vec<Value> {
    let (repository, tag) = env.image.rsplit_once(':').unwrap_or((&env.image, "latest"));
    let mut sets = vec![format!("image.repository={repository}"), format!("image.tag={tag}")];
    // The candidates run as the examples' ServiceAccounts or the default one.
    sets.extend(
        TEST_NAMESPACES
            .iter()
            .map(|ns| format!("sidecar.rbac.namespaces.{ns}={{default,scheduler,consumer}}")),
    );
    sets.extend_from_slice(more);
    let mut render = Command::new(repo().join(".venv/bin/python"));
    render
        .arg(repo().join("scripts/helm-template.py"))
        .arg(RELEASE)
        .arg(chart)
        .args(["-n", RELEASE_NAMESPACE])
        .current_dir(repo());
    for set in &sets {
        render.args(["--set", set]);
    }
    let out = render
        .output()
        .expect("running scripts/helm-template.py (scripts/setup-python.sh)");
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    yaml_objects(&String::from_utf8_lossy(&out.stdout))
}

pub fn crds() -> Vec<Value> {
    let mut objects = Vec::new();
    for entry in std::fs::read_dir(repo().join("crds")).expect("crds/") {
        let path = entry.expect("crds/ entry").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            objects.extend(yaml_objects(&std::fs::read_to_string(&path).expect("CRD file")));
        }
    }
    objects
}

/// Installs CRDs and the chart (server-side apply: idempotent, so every test
/// may call it) and waits for the operator and its webhook to serve. One
/// test process at a time, under a file lock, so the namespaces are made once.
pub async fn ensure_installed(env: &Env, client: &Client) {
    let lock_path = std::env::temp_dir().join("leasehold-e2e-install.lock");
    let lock = std::fs::File::create(&lock_path).expect("install lock file");
    lock.lock().expect("install lock");
    apply(client, &crds()).await;
    apply(client, &[namespace_object(RELEASE_NAMESPACE)]).await;
    apply(client, &install_part(rendered_chart(env))).await;
    lock.unlock().expect("install unlock");
    wait_operator_available(client).await;
}

/// Applies the chart with `sets` (as `helm upgrade --set` adds them; none:
/// back to the suite's install) and waits until only the new operator
/// serves. A change is seen by every pod injected meanwhile and undone by
/// every scenario's install, so only a `::disruptive::` scenario (run where
/// no other test uses the cluster) may make one: libtest runs each test on a
/// thread named after it, which polls the test's top-level future.
pub async fn install_chart_with(env: &Env, client: &Client, sets: &[String]) {
    let test = std::thread::current().name().unwrap_or_default().to_string();
    assert!(
        sets.is_empty() || test.contains("disruptive::"),
        "{test} changes the chart (--set {sets:?}), which the scenarios running beside it would see and undo: \
         move it into a `disruptive` module"
    );
    apply(client, &install_part(rendered_chart_with(env, sets))).await;
    wait_operator_available(client).await;
}

/// The chart's objects outside the test namespaces: each test namespace's
/// part is applied when its test makes the namespace. Helm's hooks (the
/// `helm test` pod) are not part of an install.
pub fn install_part(chart: Vec<Value>) -> Vec<Value> {
    chart
        .into_iter()
        .filter(|o| {
            let in_test_namespace =
                (o["metadata"]["namespace"].as_str()).is_some_and(|ns| TEST_NAMESPACES.contains(&ns));
            !in_test_namespace && o["metadata"]["annotations"]["helm.sh/hook"].is_null()
        })
        .collect()
}

pub fn namespace_object(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
}

pub async fn wait_operator_available(client: &Client) {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), RELEASE_NAMESPACE);
    wait_for("the operator Deployment available", Duration::from_secs(120), || {
        let deployments = deployments.clone();
        async move {
            let d = deployments.get_opt("leasehold-operator").await.ok()??;
            let want = d.spec.replicas.unwrap_or(1);
            let status = d.status?;
            let current = d.metadata.generation == status.observed_generation;
            (current && status.available_replicas == Some(want) && status.updated_replicas == Some(want)).then_some(())
        }
    })
    .await;
    // After a change, the old operator pod is terminating but still serves
    // the webhook until it exits: a pod created then is injected as the old
    // configuration says (e.g. without the cluster's name). Wait until only
    // the current pods exist.
    let pods: Api<Pod> = Api::namespaced(client.clone(), RELEASE_NAMESPACE);
    wait_for("only the current operator pods", Duration::from_secs(120), || {
        let (deployments, pods) = (deployments.clone(), pods.clone());
        async move {
            let d = deployments.get_opt("leasehold-operator").await.ok()??;
            let want = usize::try_from(d.spec.replicas.unwrap_or(1)).ok()?;
            let selector = d.spec.selector.match_labels?;
            let labels = selector
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",");
            let list = pods.list(&ListParams::default().labels(&labels)).await.ok()?;
            (list.items.len() == want && list.items.iter().all(|p| p.metadata.deletion_timestamp.is_none()))
                .then_some(())
        }
    })
    .await;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), RELEASE_NAMESPACE);
    wait_for("a ready webhook endpoint", Duration::from_secs(60), || {
        let slices = slices.clone();
        async move {
            let list = slices
                .list(&ListParams::default().labels("kubernetes.io/service-name=leasehold-webhook"))
                .await
                .ok()?;
            (ready_endpoints(&list.items) > 0).then_some(())
        }
    })
    .await;
}

/// Endpoints with `ready: true` over a Service's slices.
pub fn ready_endpoints(slices: &[EndpointSlice]) -> usize {
    slices
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
        .count()
}

/// One test's namespace and cluster, made fresh for it.
pub struct Scenario {
    pub env: Env,
    pub client: Client,
    pub ns: String,
}

impl Scenario {
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Applies objects after moving them into this test's namespace.
    pub async fn apply(&self, mut objects: Vec<Value>) {
        for object in &mut objects {
            if object["kind"] != "Namespace" {
                object["metadata"]["namespace"] = json!(self.ns);
            }
        }
        apply(&self.client, &objects).await;
    }

    /// An example from manifests/examples with this test's namespace, the
    /// stand-in app image (busybox httpd) and the given changes.
    pub fn example(&self, file: &str) -> Vec<Value> {
        let path = repo().join("manifests/examples").join(file);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        // The examples live in `my-app`, as a user's copy would name their own.
        let mut objects = yaml_objects(&text.replace("my-app", &self.ns));
        for object in &mut objects {
            if let Some(containers) = object
                .pointer_mut("/spec/template/spec/containers")
                .and_then(Value::as_array_mut)
            {
                for container in containers {
                    // The examples' stand-in app does nothing; this one serves HTTP.
                    if (container["image"].as_str()).is_some_and(|i| {
                        i.starts_with("registry.example.com/") || i.starts_with("registry.k8s.io/pause:")
                    }) {
                        container["image"] = json!(self.env.app_image);
                        container["command"] = json!(["/bin/busybox", "httpd", "-f", "-p", "8080"]);
                        if let Some(fields) = container.as_object_mut() {
                            fields.remove("args");
                        }
                    }
                }
            }
        }
        objects
    }

    pub async fn pods(&self, selector: &str) -> Vec<Pod> {
        self.api::<Pod>()
            .list(&ListParams::default().labels(selector))
            .await
            .expect("listing pods")
            .items
    }

    pub fn kubectl_ns(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", &self.ns];
        all.extend_from_slice(args);
        self.env.kubectl_ok(&all)
    }

    /// `leasehold check` of the install and this test's namespace (other tests'
    /// leases are theirs to judge): (succeeded, what it printed).
    pub fn check(&self) -> (bool, String) {
        let out = self
            .env
            .leasehold()
            .args(["check", "--lease-namespace", &self.ns])
            .output()
            .expect("running leasehold check");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    /// Everything a reader needs to see why a test failed.
    fn diagnostics(&self) -> String {
        let mut report = String::new();
        let mut section = |title: &str, args: &[&str]| {
            let out = self.env.kubectl().args(args).output();
            report.push_str(&format!("\n===== {title}: kubectl {}\n", args.join(" ")));
            match out {
                Ok(out) => {
                    report.push_str(&String::from_utf8_lossy(&out.stdout));
                    report.push_str(&String::from_utf8_lossy(&out.stderr));
                }
                Err(e) => report.push_str(&format!("cannot run kubectl: {e}\n")),
            }
        };
        section(
            "pods",
            &[
                "-n",
                &self.ns,
                "get",
                "pods,dlease,endpointslices",
                "-o",
                "wide",
                "--show-labels",
            ],
        );
        section("leases", &["-n", &self.ns, "get", "dlease", "-o", "yaml"]);
        section("events", &["-n", &self.ns, "get", "events", "--sort-by=.lastTimestamp"]);
        let pods = self
            .env
            .kubectl()
            .args(["-n", &self.ns, "get", "pods", "-o", "name"])
            .output();
        for pod in pods
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
            .lines()
        {
            section(
                &format!("logs of {pod}"),
                &["-n", &self.ns, "logs", pod, "--all-containers", "--prefix", "--tail=80"],
            );
            section(
                &format!("previous logs of {pod}"),
                &[
                    "-n",
                    &self.ns,
                    "logs",
                    pod,
                    "--all-containers",
                    "--prefix",
                    "--tail=40",
                    "--previous",
                ],
            );
        }
        let operator = self
            .env
            .kubectl()
            .args([
                "-n",
                RELEASE_NAMESPACE,
                "logs",
                "-l",
                "app.kubernetes.io/name=leasehold",
                "--prefix",
                "--tail=2000",
            ])
            .output();
        report.push_str(&format!("\n===== operator log lines naming {}\n", self.ns));
        let text = operator
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let lines: Vec<&str> = text.lines().filter(|l| l.contains(&self.ns)).collect();
        report.push_str(&lines[lines.len().saturating_sub(30)..].join("\n"));
        report
    }
}

/// Runs one test in a fresh namespace of its own (leasehold installed), and
/// prints the namespace's pods, logs and events when it fails.
pub async fn scenario<F, Fut, T>(ns: &str, body: F) -> T
where
    F: FnOnce(Scenario) -> Fut,
    Fut: Future<Output = T>,
{
    assert!(TEST_NAMESPACES.contains(&ns), "{ns} is not in TEST_NAMESPACES");
    run_in(ns, true, body).await
}

/// The README's walkthrough in its own namespace (`my-app`), which its
/// steps make themselves: only what a previous run left is removed first.
pub async fn walkthrough<F, Fut, T>(ns: &str, body: F) -> T
where
    F: FnOnce(Scenario) -> Fut,
    Fut: Future<Output = T>,
{
    run_in(ns, false, body).await
}

async fn run_in<F, Fut, T>(ns: &str, make_namespace: bool, body: F) -> T
where
    F: FnOnce(Scenario) -> Fut,
    Fut: Future<Output = T>,
{
    let env = Env::from_vars();
    let client = env.client().await;
    ensure_installed(&env, &client).await;
    if make_namespace {
        fresh_namespace(&env, &client, ns).await;
    } else {
        remove_namespace(&client, ns).await;
        wait_namespace_gone(&client, ns).await;
    }
    let scenario = Scenario {
        env: env.clone(),
        client: client.clone(),
        ns: ns.to_string(),
    };
    let for_diagnostics = Scenario {
        env,
        client,
        ns: ns.to_string(),
    };
    let outcome = AssertUnwindSafe(body(scenario)).catch_unwind().await;
    if outcome.is_err() {
        eprintln!("{}", for_diagnostics.diagnostics());
    }
    remove_namespace(&for_diagnostics.client, ns).await;
    outcome.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Deletes what a previous run left and makes the namespace again with the
/// chart's objects in it (its sidecar Role and RoleBinding).
async fn fresh_namespace(env: &Env, client: &Client, ns: &str) {
    remove_namespace(client, ns).await;
    wait_namespace_gone(client, ns).await;
    let mut namespace = namespace_object(ns);
    if !NOT_OPTED_IN.contains(&ns) {
        namespace["metadata"]["labels"] = json!({"leasehold.dev/inject": "enabled"});
    }
    apply(client, &[namespace]).await;
    // Every scenario's pods need it, the hand-made ones (not retried by a
    // controller) and the injection probe alike.
    default_service_account(client, ns).await;
    if !NOT_OPTED_IN.contains(&ns) {
        injection_reaches(env, client, ns).await;
    }
    let chart = rendered_chart(env);
    let inside: Vec<Value> = chart.into_iter().filter(|o| o["metadata"]["namespace"] == ns).collect();
    apply(client, &inside).await;
}

/// Waits until namespace `ns` has its `default` ServiceAccount. The
/// ServiceAccount admission plugin gives a pod that names none that
/// account and refuses the pod while it is missing ("error looking up
/// service account"; Kubernetes plugin/pkg/admission/serviceaccount/
/// admission.go), and kube-controller-manager's ServiceAccount controller
/// creates it only once its informer has the new namespace
/// (pkg/controller/serviceaccount/serviceaccounts_controller.go): seen
/// missing in CI when a pod was created right after the namespace, on a
/// cluster whose API server had just been restarted. Every scenario's fresh
/// namespace waits for it.
pub async fn default_service_account(client: &Client, ns: &str) {
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), ns);
    wait_for(
        &format!("the default ServiceAccount of {ns}"),
        Duration::from_secs(120),
        || async { accounts.get_opt("default").await.ok().flatten().map(drop) },
    )
    .await;
}

/// Waits until the webhook injects pods in `ns` (dry runs): the API server
/// matches webhooks' namespaceSelectors against its informer's copy of the
/// namespace, which follows a label a moment later
/// (k8s.io/apiserver/pkg/admission/plugin/webhook/predicates/namespace/matcher.go:
/// GetNamespaceLabels reads the namespace lister first; seen here as pods
/// created right after labelling a namespace going uninjected).
pub async fn injection_reaches(env: &Env, client: &Client, ns: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let probe: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "injection-probe", "annotations": {"leasehold.dev/lease": "probe"}},
        "spec": {"containers": [{"name": "app", "image": env.app_image}]},
    }))
    .expect("a pod");
    let dry_run = kube::api::PostParams {
        dry_run: true,
        ..Default::default()
    };
    // After an API server restart its informers (webhook configurations,
    // namespaces) take a while to list again: seen here above 30 s on the
    // loaded two-core machine, hence the generous bound.
    wait_for(
        &format!("the webhook injecting in {ns}"),
        Duration::from_secs(120),
        || async {
            let pod = pods.create(&dry_run, &probe).await.ok()?;
            let spec = pod.spec?;
            leasehold::api::contract::injected_container(&spec).map(|_| ())
        },
    )
    .await;
}

async fn wait_namespace_gone(client: &Client, ns: &str) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    wait_for(&format!("namespace {ns} gone"), Duration::from_secs(180), || {
        let namespaces = namespaces.clone();
        async move { namespaces.get_opt(ns).await.ok()?.is_none().then_some(()) }
    })
    .await;
}

/// Removes a test's namespace without waiting out its pods' grace periods.
async fn remove_namespace(client: &Client, ns: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let _ = pods
        .delete_collection(&DeleteParams::default().grace_period(0), &ListParams::default())
        .await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let _ = namespaces.delete(ns, &DeleteParams::default()).await;
}

/// The operator Deployment's name, as the chart names it.
pub const OPERATOR: &str = "leasehold-operator";
/// The operator pods' label selector: the chart's selector labels. Its
/// name label alone also matches the `helm test` pod (component `check`),
/// which outlives its run, so "no operator pod left" never held after it.
pub const OPERATOR_PODS: &str = "app.kubernetes.io/name=leasehold,app.kubernetes.io/component=operator";

/// The operator scaled to 0 (its webhook down) until [`restore`](Self::restore)
/// or, when the test fails first, until dropped: the cluster is left as it
/// was found either way. A `disruptive` scenario: every other scenario
/// needs the webhook.
pub struct OperatorScaledDown {
    env: Env,
    client: Client,
    replicas: i32,
    restored: bool,
}

impl OperatorScaledDown {
    /// Scales the operator to 0 and waits until the API server cannot
    /// reach its webhook: no operator pod left and no endpoint at all
    /// (terminating ones included) in the webhook Service's slices.
    pub async fn start(s: &Scenario) -> OperatorScaledDown {
        let deployments: Api<Deployment> = Api::namespaced(s.client.clone(), RELEASE_NAMESPACE);
        let replicas = deployments
            .get_scale(OPERATOR)
            .await
            .expect("the operator's scale")
            .spec
            .and_then(|spec| spec.replicas)
            .unwrap_or(1);
        let guard = OperatorScaledDown {
            env: s.env.clone(),
            client: s.client.clone(),
            replicas,
            restored: false,
        };
        deployments
            .patch_scale(
                OPERATOR,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 0}})),
            )
            .await
            .expect("scaling the operator to 0");
        let pods: Api<Pod> = Api::namespaced(s.client.clone(), RELEASE_NAMESPACE);
        let slices: Api<EndpointSlice> = Api::namespaced(s.client.clone(), RELEASE_NAMESPACE);
        wait_for(
            "no operator pod and no webhook endpoint left",
            Duration::from_secs(120),
            || async {
                let pods = pods.list(&ListParams::default().labels(OPERATOR_PODS)).await.ok()?;
                let list = slices
                    .list(&ListParams::default().labels("kubernetes.io/service-name=leasehold-webhook"))
                    .await
                    .ok()?;
                let endpoints = list.items.iter().flat_map(|s| s.endpoints.iter().flatten()).count();
                (pods.items.is_empty() && endpoints == 0).then_some(())
            },
        )
        .await;
        guard
    }

    /// Scales the operator back and waits until it serves again.
    pub async fn restore(mut self) {
        let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), RELEASE_NAMESPACE);
        let scale = json!({"spec": {"replicas": self.replicas}});
        deployments
            .patch_scale(OPERATOR, &PatchParams::default(), &Patch::Merge(scale))
            .await
            .expect("scaling the operator back");
        self.restored = true;
        wait_operator_available(&self.client).await;
    }
}

impl Drop for OperatorScaledDown {
    fn drop(&mut self) {
        if !self.restored {
            let replicas = format!("--replicas={}", self.replicas);
            let restored = self
                .env
                .kubectl()
                .args(["-n", RELEASE_NAMESPACE, "scale", "deployment", OPERATOR, &replicas])
                .status();
            eprintln!(
                "the operator scaled back to {} after a failure: {restored:?}",
                self.replicas
            );
        }
    }
}

/// Puts the CRDs back when dropped (a test that deletes them may fail
/// before it does): `kubectl apply --server-side` of crds/.
pub struct CrdsRestored {
    pub env: Env,
}

impl Drop for CrdsRestored {
    fn drop(&mut self) {
        let crds = repo().join("crds");
        let restored = self
            .env
            .kubectl()
            .args([
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager",
                "leasehold-e2e",
                "-f",
            ])
            .arg(&crds)
            .output();
        if !restored.as_ref().is_ok_and(|o| o.status.success()) {
            eprintln!("putting the CRDs back failed: {restored:?}");
        }
    }
}

/// A part of the cluster stopped (or paused) until [`start`](Self::start)
/// (or [`resume`](Self::resume)) or, when the test fails first, until
/// dropped.
pub struct ComponentDown<'a> {
    env: &'a Env,
    name: &'static str,
    /// The action that brings it back: `start` or `resume`.
    back: &'static str,
    is_back: bool,
}

impl Env {
    /// Stops a part of the cluster (see [`Env::component`]) until the guard
    /// starts it again.
    pub fn stop_component(&self, name: &'static str) -> ComponentDown<'_> {
        self.component_down(name, "stop", "start")
    }

    /// Pauses a part of the cluster (SIGSTOP: it accepts connections and
    /// never answers) until the guard resumes it.
    pub fn pause_component(&self, name: &'static str) -> ComponentDown<'_> {
        self.component_down(name, "pause", "resume")
    }

    fn component_down(&self, name: &'static str, down: &str, back: &'static str) -> ComponentDown<'_> {
        self.component(name, down);
        ComponentDown {
            env: self,
            name,
            back,
            is_back: false,
        }
    }

    /// The API server's address, from the kubeconfig.
    pub fn api_server_addr(&self) -> std::net::SocketAddr {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig).expect("kubeconfig");
        let server = kubeconfig.clusters[0]
            .cluster
            .as_ref()
            .and_then(|c| c.server.clone())
            .expect("the kubeconfig's server");
        let uri: http::Uri = server.parse().expect("the server's URL");
        let host = uri.host().expect("a host").trim_matches(|c| c == '[' || c == ']');
        let port = uri.port_u16().unwrap_or(443);
        std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
            .expect("resolving the API server")
            .next()
            .expect("an address")
    }
}

impl ComponentDown<'_> {
    pub fn start(self) {
        self.back()
    }

    pub fn resume(self) {
        self.back()
    }

    fn back(mut self) {
        self.is_back = true;
        self.env.component(self.name, self.back);
    }
}

impl Drop for ComponentDown<'_> {
    fn drop(&mut self) {
        if !self.is_back {
            let command = self.env.component.clone().unwrap_or_default();
            let back = Command::new("sh")
                .arg("-c")
                .arg(format!("{command} {} {}", self.name, self.back))
                .status();
            eprintln!("{} brought back ({}) after a failure: {back:?}", self.name, self.back);
        }
    }
}

/// The namespaces that more than one [`scenario`] call names in `sources`
/// (file, text), with the file of each call: the scenarios run two at a
/// time, so a namespace two share would let one delete the other's pods.
fn shared_scenario_namespaces(sources: &[(String, String)]) -> Vec<(String, Vec<String>)> {
    let mut users: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for (file, text) in sources {
        for call in text.split("scenario(\"").skip(1) {
            let ns = call.split('"').next().unwrap_or_default();
            users.entry(ns.to_string()).or_default().push(file.clone());
        }
    }
    users.into_iter().filter(|(_, files)| files.len() > 1).collect()
}

/// No two scenarios share a namespace; the check finds a planted pair.
#[test]
fn every_scenario_has_a_namespace_of_its_own() {
    let sources: Vec<(String, String)> = std::fs::read_dir(repo().join("tests/e2e"))
        .expect("tests/e2e")
        .map(|entry| entry.expect("an entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "rs"))
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("a source file");
            (path.file_name().unwrap().to_string_lossy().into_owned(), text)
        })
        .collect();
    assert_eq!(shared_scenario_namespaces(&sources), Vec::new());
    // Spelled so that this file's own text names no namespace twice.
    let call = |ns: &str| format!("{}(\"{ns}\", |s| async move {{}})", "scenario");
    let planted = [
        ("a.rs".to_string(), call("e2e-x") + &call("e2e-y")),
        ("b.rs".to_string(), call("e2e-x")),
    ];
    assert_eq!(
        shared_scenario_namespaces(&planted),
        vec![("e2e-x".to_string(), vec!["a.rs".to_string(), "b.rs".to_string()])]
    );
}
