//! A real Prometheus (Debian's, started here on loopback) scraping the
//! cluster the way the chart's PodMonitor (the sidecars) and ServiceMonitor
//! (the operator) tell the Prometheus operator to, with the shipped
//! alerting rules.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

use crate::e2e::cluster::{Env, RELEASE_NAMESPACE, Scenario, rendered_chart_at, repo, wait_for};
use crate::e2e::fixtures::LEASE;

/// Scrape and rule evaluation interval of the test's Prometheus (the
/// chart's monitors say 30 s: the one setting of theirs changed here).
pub const INTERVAL: &str = "1s";
/// [`Prometheus::start`] runs every `for` and every range of the shipped
/// rules this many times shorter, so a fault fires within a test's minutes.
pub const TIME_SCALE: u64 = 10;
/// Prometheus's scrapes and evaluations start within a few intervals; this
/// bounds each wait for a result in the generous way of the suite.
pub const PROMETHEUS_WAIT: Duration = Duration::from_secs(90);

/// A planted defect in one shipped rule (alert `alert`), to show that a
/// check of the suite fails on a rule that misbehaves.
pub struct Plant {
    pub alert: &'static str,
    pub change: PlantedChange,
}

pub enum PlantedChange {
    /// In the expression, `from` replaced by `to` (e.g. a threshold no
    /// value reaches: a rule that cannot fire).
    Expr { from: &'static str, to: &'static str },
    /// The rule's `for` replaced (e.g. `0s`: a rule that fires on what its
    /// `for` exists to wait out).
    For(&'static str),
}

/// The shipped rules with every duration divided by `scale` (and `plant`
/// made), and the alerts' `for`s so scaled (name, for).
fn rendered_rules(scale: u64, plant: Option<&Plant>) -> (String, Vec<(String, Duration)>) {
    let shipped = std::fs::read_to_string(repo().join("manifests/prometheus/leasehold-rules.yaml")).unwrap();
    let mut parsed: Value = serde_yaml::from_str(&shipped).unwrap();
    let mut fors = Vec::new();
    let mut planted = false;
    for group in parsed["groups"].as_array_mut().unwrap() {
        for rule in group["rules"].as_array_mut().unwrap() {
            let name = rule["alert"].as_str().unwrap().to_string();
            let mut expr = rule["expr"].as_str().unwrap().to_string();
            let mut for_ = rule["for"].as_str().unwrap().to_string();
            match plant.filter(|p| p.alert == name).map(|p| &p.change) {
                Some(PlantedChange::Expr { from, to }) => {
                    assert!(expr.contains(from), "{name}'s expression has no {from:?}: {expr}");
                    expr = expr.replace(from, to);
                    planted = true;
                }
                Some(PlantedChange::For(planted_for)) => {
                    for_ = planted_for.to_string();
                    planted = true;
                }
                None => {}
            }
            rule["for"] = json!(scaled(&for_, scale));
            rule["expr"] = json!(scaled_ranges(&expr, scale));
            fors.push((name, seconds(rule["for"].as_str().unwrap())));
        }
    }
    assert!(plant.is_none() || planted, "no shipped alert to plant in");
    (serde_yaml::to_string(&parsed).unwrap(), fors)
}

/// A Prometheus duration of one unit (`90s`, `2m`, `1h`).
fn seconds(duration: &str) -> Duration {
    let (number, unit) = duration.split_at(duration.len() - 1);
    let number: u64 = number.parse().unwrap_or_else(|e| panic!("duration {duration}: {e}"));
    let unit = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => panic!("duration {duration}: a unit of s, m or h"),
    };
    Duration::from_secs(number * unit)
}

/// `duration` divided by `scale`, in seconds.
fn scaled(duration: &str, scale: u64) -> String {
    let secs = seconds(duration).as_secs();
    assert_eq!(secs % scale, 0, "{duration} is no whole number of seconds once scaled");
    format!("{}s", secs / scale)
}

/// Every range (`[5m]`), subquery range (`[10m:]`) and offset (`offset
/// 2m`) of `expr` scaled.
fn scaled_ranges(expr: &str, scale: u64) -> String {
    let mut out = String::new();
    let mut rest = expr;
    while let Some(open) = rest.find('[') {
        let close = open + rest[open..].find(']').expect("a closed range");
        let inside = &rest[open + 1..close];
        let (range, step) = inside.split_once(':').map_or((inside, None), |(r, s)| (r, Some(s)));
        out.push_str(&rest[..=open]);
        out.push_str(&scaled(range, scale));
        if let Some(step) = step {
            out.push(':');
            if !step.is_empty() {
                out.push_str(&scaled(step, scale));
            }
        }
        out.push(']');
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    scaled_offsets(&out, scale)
}

/// Every `offset DURATION` of `expr` scaled.
fn scaled_offsets(expr: &str, scale: u64) -> String {
    const OFFSET: &str = "offset ";
    let mut out = String::new();
    let mut rest = expr;
    while let Some(at) = rest.find(OFFSET) {
        let start = at + OFFSET.len();
        let end = start
            + rest[start..]
                .find(|c: char| !c.is_ascii_alphanumeric())
                .unwrap_or(rest.len() - start);
        out.push_str(&rest[..start]);
        out.push_str(&scaled(&rest[start..end], scale));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// The chart's ServiceMonitor and PodMonitor, rendered by real Helm with
/// both on, as on a cluster that serves monitoring.coreos.com/v1: the
/// offline render knows no cluster's APIs, so a copy of the chart has the
/// capability test true (as scripts/check-manifests.py renders them).
fn chart_monitors(env: &Env, dir: &Path) -> Vec<Value> {
    let chart = dir.join("chart");
    let copied = Command::new("cp")
        .arg("-r")
        .arg(repo().join("charts/leasehold"))
        .arg(&chart)
        .status()
        .unwrap();
    assert!(copied.success(), "copying the chart");
    let capability = "(.Capabilities.APIVersions.Has \"monitoring.coreos.com/v1\")";
    for template in ["servicemonitor.yaml", "podmonitor.yaml"] {
        let path = chart.join("templates").join(template);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(capability), "{template} is guarded by {capability}");
        std::fs::write(&path, text.replace(capability, "true")).unwrap();
    }
    let sets = [
        "metrics.serviceMonitor.enabled=true".to_string(),
        "metrics.podMonitor.enabled=true".to_string(),
    ];
    let monitors: Vec<Value> = rendered_chart_at(env, &chart, &sets)
        .into_iter()
        .filter(|o| o["apiVersion"] == "monitoring.coreos.com/v1" && o["kind"] != "PrometheusRule")
        .collect();
    std::fs::remove_dir_all(&chart).unwrap();
    monitors
}

/// The scrape jobs the Prometheus operator generates for a ServiceMonitor
/// or PodMonitor (its pkg/prometheus/promcfg.go: keep the selected
/// objects and the named port, drop finished pods, label namespace,
/// container, pod, job and endpoint, then the monitor's own
/// relabelings), discovering as [`Discovery`] says. Only what the chart's
/// monitors use is translated: anything else fails here, not silently.
fn scrape_jobs(monitor: &Value, dir: &Path) -> Vec<(Value, Discovery)> {
    let kind = monitor["kind"].as_str().unwrap();
    let (ns, name) = (
        monitor["metadata"]["namespace"].as_str().unwrap(),
        monitor["metadata"]["name"].as_str().unwrap(),
    );
    let spec = &monitor["spec"];
    let (role, object, endpoints, port_label) = match kind {
        "PodMonitor" => (
            "pod",
            "pod",
            "podMetricsEndpoints",
            "__meta_kubernetes_pod_container_port_name",
        ),
        // The EndpointSlice role (the operator's serviceDiscoveryRole
        // EndpointSlice): Endpoints are deprecated from Kubernetes 1.33.
        "ServiceMonitor" => (
            "endpointslice",
            "service",
            "endpoints",
            "__meta_kubernetes_endpointslice_port_name",
        ),
        other => panic!("no scrape jobs for a {other}"),
    };
    let selector = &spec["namespaceSelector"];
    let namespaces = if selector["any"] == true {
        None
    } else if let Some(names) = selector["matchNames"].as_array() {
        Some(names.iter().map(|n| n.as_str().unwrap().to_string()).collect())
    } else {
        Some(vec![ns.to_string()])
    };
    let selector = &spec["selector"];
    assert!(
        selector["matchExpressions"].is_null(),
        "{kind} {name}: matchExpressions are not translated"
    );
    let keeps: Vec<Value> = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(label, value)| {
            let label = sanitized(label);
            json!({"action": "keep",
                   "source_labels": [format!("__meta_kubernetes_{object}_label_{label}"),
                                     format!("__meta_kubernetes_{object}_labelpresent_{label}")],
                   "regex": format!("({});true", value.as_str().unwrap())})
        })
        .collect();
    let job = if kind == "PodMonitor" {
        json!({"target_label": "job", "replacement": format!("{ns}/{name}")})
    } else {
        json!({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"})
    };
    spec[endpoints]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, endpoint)| {
            let port = endpoint["port"].as_str().expect("an endpoint's port name");
            let mut relabel = keeps.clone();
            relabel.push(json!({"action": "keep", "source_labels": [port_label], "regex": port}));
            relabel.push(
                json!({"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"}),
            );
            for (from, to) in [
                ("__meta_kubernetes_namespace", "namespace"),
                ("__meta_kubernetes_pod_container_name", "container"),
                ("__meta_kubernetes_pod_name", "pod"),
            ] {
                relabel.push(json!({"source_labels": [from], "target_label": to}));
            }
            relabel.push(job.clone());
            relabel.push(json!({"target_label": "endpoint", "replacement": port}));
            relabel.extend(endpoint["relabelings"].as_array().into_iter().flatten().map(relabeling));
            let job_name = format!("{}/{ns}/{name}/{i}", kind[..1].to_lowercase() + &kind[1..]);
            let file = dir.join(format!("{}.json", job_name.replace('/', "-")));
            write_atomically(&file, "[]");
            let job = json!({
                "job_name": job_name,
                "file_sd_configs": [{"files": [file]}],
                "relabel_configs": relabel,
            });
            let discovery = Discovery {
                role,
                namespaces: namespaces.clone(),
                file,
            };
            (job, discovery)
        })
        .collect()
}

/// What one job's `kubernetes_sd_configs` would discover. Debian's
/// Prometheus is built without the Kubernetes discovery, so the test lists
/// the objects itself and hands Prometheus each target with the meta
/// labels that discovery documents (Prometheus's configuration docs,
/// `<kubernetes_sd_config>`, roles `pod` and `endpointslice`) through a
/// file_sd file; the monitors' relabelings then select and label them in
/// Prometheus, as on a cluster with the Prometheus operator.
struct Discovery {
    role: &'static str,
    namespaces: Option<Vec<String>>,
    file: PathBuf,
}

/// `name` as a label name: every character other than [a-zA-Z0-9_] an
/// underscore (Prometheus's strutil.SanitizeLabelName).
fn sanitized(name: &str) -> String {
    name.replace(|c: char| !c.is_ascii_alphanumeric() && c != '_', "_")
}

type Labels = serde_json::Map<String, Value>;

/// A pod's meta labels, as both roles attach them.
fn pod_labels(pod: &Pod) -> Labels {
    let mut labels = Labels::new();
    let meta = &pod.metadata;
    let status = pod.status.clone().unwrap_or_default();
    let ready = (status.conditions.iter().flatten()).any(|c| c.type_ == "Ready" && c.status == "True");
    for (key, value) in [
        ("namespace", meta.namespace.clone()),
        ("pod_name", meta.name.clone()),
        ("pod_uid", meta.uid.clone()),
        ("pod_ip", status.pod_ip.clone()),
        ("pod_phase", status.phase.clone()),
        ("pod_ready", Some(ready.to_string())),
    ] {
        labels.insert(format!("__meta_kubernetes_{key}"), json!(value.unwrap_or_default()));
    }
    for (kind, map) in [("label", &meta.labels), ("annotation", &meta.annotations)] {
        for (key, value) in map.iter().flatten() {
            let key = sanitized(key);
            labels.insert(format!("__meta_kubernetes_pod_{kind}_{key}"), json!(value));
            labels.insert(format!("__meta_kubernetes_pod_{kind}present_{key}"), json!("true"));
        }
    }
    labels
}

/// The objects of `namespaces` (None: of all).
async fn list<K>(client: &Client, namespaces: &Option<Vec<String>>) -> Option<Vec<K>>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    <K as kube::Resource>::DynamicType: Default,
{
    let params = ListParams::default();
    match namespaces {
        None => Some(Api::<K>::all(client.clone()).list(&params).await.ok()?.items),
        Some(names) => {
            let mut all = Vec::new();
            for ns in names {
                all.extend(Api::<K>::namespaced(client.clone(), ns).list(&params).await.ok()?.items);
            }
            Some(all)
        }
    }
}

/// Role `pod`: one target per declared port of every container, init
/// containers (native sidecars declare theirs there) included.
async fn pod_targets(client: &Client, namespaces: &Option<Vec<String>>) -> Option<Vec<Value>> {
    let mut targets = Vec::new();
    for pod in list::<Pod>(client, namespaces).await? {
        let (Some(spec), Some(ip)) = (&pod.spec, pod.status.as_ref().and_then(|s| s.pod_ip.clone())) else {
            continue;
        };
        let common = pod_labels(&pod);
        let containers = (spec.containers.iter().map(|c| (c, false)))
            .chain(spec.init_containers.iter().flatten().map(|c| (c, true)));
        for (container, init) in containers {
            for port in container.ports.iter().flatten() {
                let mut labels = common.clone();
                for (key, value) in [
                    ("container_name", container.name.clone()),
                    ("container_init", init.to_string()),
                    ("container_port_name", port.name.clone().unwrap_or_default()),
                    ("container_port_number", port.container_port.to_string()),
                    (
                        "container_port_protocol",
                        port.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    ),
                ] {
                    labels.insert(format!("__meta_kubernetes_pod_{key}"), json!(value));
                }
                targets.push(json!({"targets": [format!("{ip}:{}", port.container_port)], "labels": labels}));
            }
        }
    }
    Some(targets)
}

/// Role `endpointslice`: one target per address and port of every slice,
/// with its Service's labels and, for a pod's address, the pod's.
async fn slice_targets(client: &Client, namespaces: &Option<Vec<String>>) -> Option<Vec<Value>> {
    let slices: Vec<EndpointSlice> = list(client, namespaces).await?;
    let services: Vec<Service> = list(client, namespaces).await?;
    let pods: Vec<Pod> = list(client, namespaces).await?;
    let mut targets = Vec::new();
    for slice in slices {
        let ns = slice.metadata.namespace.clone().unwrap_or_default();
        let mut common = Labels::new();
        common.insert("__meta_kubernetes_namespace".into(), json!(ns));
        common.insert(
            "__meta_kubernetes_endpointslice_name".into(),
            json!(slice.metadata.name),
        );
        let service_name = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("kubernetes.io/service-name"));
        let service = services
            .iter()
            .find(|s| s.metadata.namespace.as_deref() == Some(ns.as_str()) && s.metadata.name.as_ref() == service_name);
        if let Some(service) = service {
            common.insert("__meta_kubernetes_service_name".into(), json!(service.metadata.name));
            for (key, value) in service.metadata.labels.iter().flatten() {
                let key = sanitized(key);
                common.insert(format!("__meta_kubernetes_service_label_{key}"), json!(value));
                common.insert(format!("__meta_kubernetes_service_labelpresent_{key}"), json!("true"));
            }
        }
        for endpoint in slice.endpoints.iter().flatten() {
            let ready = endpoint.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false);
            let pod = (endpoint.target_ref.as_ref())
                .filter(|r| r.kind.as_deref() == Some("Pod"))
                .and_then(|r| {
                    pods.iter()
                        .find(|p| p.metadata.namespace.as_deref() == Some(ns.as_str()) && p.metadata.name == r.name)
                });
            for port in slice.ports.iter().flatten() {
                let number = port.port.unwrap_or_default();
                for address in &endpoint.addresses {
                    let mut labels = common.clone();
                    if let Some(pod) = pod {
                        labels.extend(pod_labels(pod));
                        let container = (pod.spec.iter().flat_map(|s| &s.containers))
                            .find(|c| c.ports.iter().flatten().any(|p| p.container_port == number));
                        if let Some(container) = container {
                            labels.insert("__meta_kubernetes_pod_container_name".into(), json!(container.name));
                        }
                    }
                    for (key, value) in [
                        ("endpointslice_port_name", port.name.clone().unwrap_or_default()),
                        ("endpointslice_port", number.to_string()),
                        ("endpointslice_endpoint_conditions_ready", ready.to_string()),
                    ] {
                        labels.insert(format!("__meta_kubernetes_{key}"), json!(value));
                    }
                    targets.push(json!({"targets": [format!("{address}:{number}")], "labels": labels}));
                }
            }
        }
    }
    Some(targets)
}

/// Keeps each job's file_sd file current with what its role discovers,
/// twice a second, until aborted.
async fn discover(client: Client, jobs: Vec<Discovery>) {
    loop {
        for job in &jobs {
            let targets = match job.role {
                "pod" => pod_targets(&client, &job.namespaces).await,
                _ => slice_targets(&client, &job.namespaces).await,
            };
            // A failed list keeps the last targets, as a watch would.
            if let Some(targets) = targets {
                write_atomically(&job.file, &Value::from(targets).to_string());
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A monitor's relabeling (camelCase, as the CRD spells it) as Prometheus
/// spells it.
fn relabeling(from: &Value) -> Value {
    let mut out = serde_json::Map::new();
    for (key, value) in from.as_object().unwrap() {
        let key = match key.as_str() {
            "sourceLabels" => "source_labels",
            "targetLabel" => "target_label",
            "action" | "regex" | "replacement" | "separator" => key,
            other => panic!("relabeling field {other} is not translated"),
        };
        out.insert(key.to_string(), value.clone());
    }
    Value::Object(out)
}

/// A folder of its own under the temp dir.
pub fn tempdir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("leasehold-e2e-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Debian's Prometheus on a loopback port: the chart's monitors' jobs, the
/// shipped rules (scaled), and a `planted` file_sd job that starts
/// empty (for a planted fault).
pub struct Prometheus {
    child: Child,
    discovery: tokio::task::JoinHandle<()>,
    port: u16,
    pub dir: PathBuf,
    /// How many times shorter than shipped its rules' ranges and `for`s are.
    scale: u64,
    /// Each alert's `for` as this Prometheus evaluates it.
    pub fors: Vec<(String, Duration)>,
}

impl Prometheus {
    /// The shipped rules at [`TIME_SCALE`].
    pub fn start(s: &Scenario, name: &str) -> Prometheus {
        Self::start_with(s, name, TIME_SCALE, None)
    }

    /// The shipped rules at `scale` (1: as shipped), with `plant` made.
    pub fn start_with(s: &Scenario, name: &str, scale: u64, plant: Option<&Plant>) -> Prometheus {
        let dir = tempdir(&format!("prometheus-{name}"));
        let (text, fors) = rendered_rules(scale, plant);
        std::fs::write(dir.join("rules.yaml"), text).unwrap();
        let (mut jobs, discoveries): (Vec<Value>, Vec<Discovery>) = chart_monitors(&s.env, &dir)
            .iter()
            .flat_map(|m| scrape_jobs(m, &dir))
            .unzip();
        assert_eq!(
            jobs.len(),
            2,
            "the chart's monitors scrape the sidecars and the operator: {jobs:?}"
        );
        let discovery = tokio::spawn(discover(s.client.clone(), discoveries));
        jobs.push(json!({"job_name": "planted", "file_sd_configs": [{"files": [dir.join("planted.json")]}]}));
        let config = json!({
            "global": {"scrape_interval": INTERVAL, "evaluation_interval": INTERVAL, "scrape_timeout": INTERVAL},
            "rule_files": [dir.join("rules.yaml")],
            "scrape_configs": jobs,
        });
        std::fs::write(dir.join("prometheus.yml"), serde_yaml::to_string(&config).unwrap()).unwrap();
        write_atomically(&dir.join("planted.json"), "[]");
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting prometheus: {e}; install it (Debian: apt-get install prometheus; scripts/setup-servers.sh does)"));
        Prometheus {
            child,
            discovery,
            port,
            dir,
            scale,
            fors,
        }
    }

    /// A duration of the shipped rules (`2m`) as this Prometheus evaluates it.
    pub fn scaled(&self, duration: &str) -> String {
        scaled(duration, self.scale)
    }

    /// GET on the HTTP API; the `data` of a successful answer.
    pub fn get(&self, path: &str, params: &[(&str, &str)]) -> Option<Value> {
        let query: String = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params)
            .finish();
        let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)).ok()?;
        write!(stream, "GET {path}?{query} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        let (_, body) = answer.split_once("\r\n\r\n")?;
        let body: Value = serde_json::from_str(body).ok()?;
        (body["status"] == "success").then(|| body["data"].clone())
    }

    /// An instant query's result vector.
    pub fn query(&self, promql: &str) -> Option<Vec<Value>> {
        self.get("/api/v1/query", &[("query", promql)])?["result"]
            .as_array()
            .cloned()
    }

    /// The series of a range query (`x[5m]`, a subquery): each one's
    /// labels and samples (Unix time, value).
    pub fn matrix(&self, promql: &str) -> Vec<(Value, Vec<(f64, f64)>)> {
        let result = self
            .query(promql)
            .unwrap_or_else(|| panic!("Prometheus answers `{promql}`"));
        let sample = |v: &Value| (v[0].as_f64().unwrap(), v[1].as_str().unwrap().parse().unwrap());
        let series = |r: Value| {
            (
                r["metric"].clone(),
                r["values"].as_array().unwrap().iter().map(sample).collect(),
            )
        };
        result.into_iter().map(series).collect()
    }

    /// [`matrix`](Self::matrix) of `promql` over the last `window`, one
    /// sample a second (a subquery).
    pub fn over(&self, promql: &str, window: Duration) -> Vec<(Value, Vec<(f64, f64)>)> {
        self.matrix(&format!("({promql})[{}s:1s]", window.as_secs().max(1)))
    }

    /// The alerts named `name` in `state` (pending or firing) now.
    pub fn alerts(&self, name: &str, state: &str) -> Option<Vec<Value>> {
        let alerts = self.get("/api/v1/alerts", &[])?["alerts"].as_array()?.clone();
        Some(
            alerts
                .into_iter()
                .filter(|a| a["labels"]["alertname"] == name && a["state"] == state)
                .collect(),
        )
    }

    /// `name` firing now for namespace `ns` (and this suite's lease, when
    /// the alert is a lease's).
    pub fn firing(&self, ns: &str, name: &str) -> Option<Value> {
        self.alerts(name, "firing")?.into_iter().find(|a| concerns(a, ns))
    }

    /// Whether `name` is pending or firing now for namespace `ns` (as
    /// [`firing`](Self::firing) selects), when Prometheus answers.
    pub fn active(&self, ns: &str, name: &str) -> Option<bool> {
        ["pending", "firing"].iter().try_fold(false, |any, state| {
            Some(any || self.alerts(name, state)?.iter().any(|a| concerns(a, ns)))
        })
    }

    /// Waits until `name` is neither pending nor firing for `ns`: what fires
    /// after a fault is then the fault's.
    pub async fn quiet(&self, ns: &str, name: &str) {
        wait_for(&format!("{name} inactive for {ns}"), PROMETHEUS_WAIT, || async {
            (!self.active(ns, name)?).then_some(())
        })
        .await
    }

    /// `name`'s `for` as this Prometheus evaluates it.
    pub fn for_of(&self, name: &str) -> Duration {
        let (_, duration) = self.fors.iter().find(|(n, _)| n == name).expect("a shipped alert");
        *duration
    }

    /// [`fires`](Self::fires), printing the time from `fault` (what it
    /// was) to firing with the alert's `for`: the figures of
    /// docs/runbooks.md.
    pub async fn fires_after(&self, ns: &str, name: &str, fault: (Instant, &str), within: Duration) -> Value {
        let alert = self.fires(ns, name, within).await;
        eprintln!(
            "{name} fired {:?} after {} (for: {:?}): {alert}",
            fault.0.elapsed(),
            fault.1,
            self.for_of(name)
        );
        alert
    }

    /// [`resolves`](Self::resolves), printing the time from `healed`
    /// (what healed it).
    pub async fn resolves_after(&self, ns: &str, name: &str, healed: (Instant, &str), within: Duration) {
        self.resolves(ns, name, within).await;
        eprintln!("{name} resolved {:?} after {}", healed.0.elapsed(), healed.1);
    }

    /// The expression Prometheus evaluates for alert `name`.
    pub fn loaded_expr(&self, name: &str) -> String {
        let rules = self.get("/api/v1/rules", &[]).expect("/api/v1/rules");
        let rule = rules["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap())
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("{name} is not loaded"));
        rule["query"].as_str().unwrap().to_string()
    }

    /// `value` of `promql` (a single number), once it is.
    pub async fn sees_value(&self, what: &str, promql: &str, value: f64) {
        let started = Instant::now();
        loop {
            let seen = self.query(promql);
            let number = seen
                .as_ref()
                .and_then(|r| r.first())
                .and_then(|r| r["value"][1].as_str()?.parse::<f64>().ok());
            if number == Some(value) {
                return;
            }
            if started.elapsed() > PROMETHEUS_WAIT {
                panic!(
                    "Prometheus sees {what}: not within {PROMETHEUS_WAIT:?}; last `{promql}`: {seen:?}; targets: {:?}",
                    self.targets()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Every target: (job, scrape URL, health, last error).
    pub fn targets(&self) -> Vec<Value> {
        let targets = self.get("/api/v1/targets", &[]).unwrap_or_default();
        targets["activeTargets"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| json!([t["labels"]["job"], t["scrapeUrl"], t["health"], t["lastError"]]))
            .collect()
    }

    /// Waits until the scraped sidecars of the scenario's lease sum to
    /// `leaders` leaders over `candidates` candidates.
    pub async fn sees(&self, s: &Scenario, leaders: u64, candidates: u64) {
        let selector = format!("{{namespace=\"{}\", lease=\"{LEASE}\"}}", s.ns);
        let promql = format!("sum(leasehold_is_leader{selector}) * 1000 + count(leasehold_is_leader{selector})");
        let what = format!("{leaders} leader(s) among {candidates} sidecar(s)");
        self.sees_value(&what, &promql, (leaders * 1000 + candidates) as f64)
            .await;
    }

    /// Waits until the operator's replicas, scraped through the chart's
    /// ServiceMonitor, show one active among `replicas`.
    pub async fn sees_operator(&self, replicas: u64) {
        let selector = format!("{{namespace=\"{RELEASE_NAMESPACE}\", job=\"leasehold-metrics\"}}");
        let promql = format!(
            "sum(leasehold_operator_is_leader{selector}) * 1000 + count(leasehold_operator_is_leader{selector})"
        );
        let what = format!("one active operator among {replicas} replica(s)");
        self.sees_value(&what, &promql, (1000 + replicas) as f64).await;
    }

    /// Waits until `name` fires for namespace `ns`; the alert.
    pub async fn fires(&self, ns: &str, name: &str, within: Duration) -> Value {
        wait_for(&format!("{name} firing for {ns}"), within, || async {
            self.firing(ns, name)
        })
        .await
    }

    /// Waits until `name` no longer fires for namespace `ns`.
    pub async fn resolves(&self, ns: &str, name: &str, within: Duration) {
        wait_for(&format!("{name} resolved for {ns}"), within, || async {
            self.alerts(name, "firing")?;
            self.firing(ns, name).is_none().then_some(())
        })
        .await
    }

    /// The instants in the last `window` at which `name` was firing for
    /// namespace `ns` (the `ALERTS` series Prometheus writes at every
    /// evaluation).
    pub fn fired_within(&self, ns: &str, name: &str, window: Duration) -> Vec<Value> {
        let promql = format!(
            "ALERTS{{alertname=\"{name}\", alertstate=\"firing\", namespace=\"{ns}\"}}[{}s]",
            window.as_secs().max(1)
        );
        self.query(&promql).expect("a range query")
    }
}

/// The chart's Grafana dashboard (charts/leasehold/files/).
pub fn dashboard() -> Value {
    let path = repo().join("charts/leasehold/files/leasehold-dashboard.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Every panel's targets (rows' panels included): (panel title, PromQL).
fn panel_queries(dashboard: &Value) -> Vec<(String, String)> {
    fn walk(panels: &Value, out: &mut Vec<(String, String)>) {
        for panel in panels.as_array().into_iter().flatten() {
            walk(&panel["panels"], out);
            for target in panel["targets"].as_array().into_iter().flatten() {
                let title = panel["title"].as_str().unwrap_or_default().to_string();
                out.push((
                    title,
                    target["expr"].as_str().expect("a Prometheus target's expr").to_string(),
                ));
            }
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// `expr` as Grafana sends it to Prometheus with `chosen` values of the
/// dashboard's template variables (`$name`, `${name}`). One value of a
/// multi-value variable goes in as itself: Grafana's Prometheus data
/// source escapes only regex metacharacters in it
/// (`prometheusSpecialRegexEscape` in its datasource.ts), which the chosen
/// values must not hold (asserted). `$__rate_interval` is the larger of
/// `$__interval` plus the scrape interval and four scrape intervals
/// (grafana/grafana#77234), with the data source's scrape interval set to
/// this Prometheus's [`INTERVAL`]: 4 s, as `$__interval` never falls below
/// the scrape interval. Any other variable fails here.
fn grafana_interpolated(expr: &str, chosen: &[(&str, &str)]) -> String {
    let scrape = seconds(INTERVAL).as_secs();
    let mut values: Vec<(String, String)> = vec![("__rate_interval".into(), format!("{}s", 4 * scrape))];
    for (name, value) in chosen {
        assert!(
            !value.contains(|c: char| "\\^$*+?.()|{}[]".contains(c)),
            "{name}={value}: Grafana would escape it"
        );
        values.push((name.to_string(), value.to_string()));
    }
    let mut out = expr.to_string();
    // Longest names first: `$lease` must not eat the start of `$leases`.
    values.sort_by_key(|(name, _)| std::cmp::Reverse(name.len()));
    for (name, value) in &values {
        out = out
            .replace(&format!("${{{name}}}"), value)
            .replace(&format!("${name}"), value);
    }
    assert!(
        !out.contains('$'),
        "a template variable left in `{out}` (from `{expr}`)"
    );
    out
}

/// The dashboard's panels whose queries (with `chosen` variables, see
/// [`grafana_interpolated`]) return no series now, or fail: (title, query).
pub fn empty_panels(prometheus: &Prometheus, dashboard: &Value, chosen: &[(&str, &str)]) -> Vec<(String, String)> {
    panel_queries(dashboard)
        .into_iter()
        .map(|(title, expr)| (title, grafana_interpolated(&expr, chosen)))
        .filter(|(_, promql)| prometheus.query(promql).is_none_or(|series| series.is_empty()))
        .collect()
}

/// Waits until every panel of `dashboard` returns a series (the rate
/// panels need samples within their window); fails naming those that do
/// not.
pub async fn every_panel_answers(prometheus: &Prometheus, dashboard: &Value, chosen: &[(&str, &str)]) {
    let started = Instant::now();
    loop {
        let empty = empty_panels(prometheus, dashboard, chosen);
        if empty.is_empty() {
            return;
        }
        assert!(
            started.elapsed() < PROMETHEUS_WAIT,
            "dashboard panels with no series within {PROMETHEUS_WAIT:?}: {empty:#?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// An alert of namespace `ns` and, when it is a lease's, of this suite's lease.
fn concerns(alert: &Value, ns: &str) -> bool {
    let labels = &alert["labels"];
    labels["namespace"] == ns && (labels["lease"].is_null() || labels["lease"] == LEASE)
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.discovery.abort();
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            eprintln!(
                "===== prometheus log (last lines)\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// file_sd reads a file as soon as it changes: it must never see half of one.
pub fn write_atomically(path: &Path, text: &str) {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, text).unwrap();
    std::fs::rename(&partial, path).unwrap();
}

#[test]
fn scaling_divides_every_range_and_keeps_the_rest() {
    assert_eq!(
        scaled_ranges(
            "avg_over_time((max(x))[10m:]) < 0.75 and max_over_time(x[2m]) == 1 or y[15m:1m]",
            10
        ),
        "avg_over_time((max(x))[60s:]) < 0.75 and max_over_time(x[12s]) == 1 or y[90s:6s]"
    );
    assert_eq!(
        scaled_ranges("increase(x[2m]) == 0 and on (pod) (x offset 2m)", 10),
        "increase(x[12s]) == 0 and on (pod) (x offset 12s)"
    );
    assert_eq!(scaled("5m", 10), "30s");
    assert_eq!(scaled("5m", 1), "300s");
}

#[test]
fn a_plant_changes_its_alert_only() {
    type Rule = (String, String, String);
    /// Each rule as (alert, expr, for), rendered at `scale`.
    fn rules(scale: u64, plant: Option<&Plant>) -> Vec<Rule> {
        let (text, _) = rendered_rules(scale, plant);
        let parsed: Value = serde_yaml::from_str(&text).unwrap();
        let groups = parsed["groups"].as_array().unwrap().iter();
        groups
            .flat_map(|g| g["rules"].as_array().unwrap())
            .map(|r| {
                let field = |f: &str| r[f].as_str().unwrap().to_string();
                (field("alert"), field("expr"), field("for"))
            })
            .collect()
    }
    /// The one rule `plant` changes: (shipped, planted).
    fn changed(scale: u64, plant: &Plant) -> (Rule, Rule) {
        let pairs = rules(scale, None).into_iter().zip(rules(scale, Some(plant)));
        let changed: Vec<(Rule, Rule)> = pairs.filter(|(a, b)| a != b).collect();
        assert_eq!(changed.len(), 1, "{changed:?}");
        assert_eq!(changed[0].0.0, plant.alert);
        changed[0].clone()
    }
    let threshold = Plant {
        alert: "LeaseholdStoreFailures",
        change: PlantedChange::Expr {
            from: "> 0",
            to: "> 1e9",
        },
    };
    let (before, after) = changed(TIME_SCALE, &threshold);
    assert_eq!(after.1, before.1.replace("> 0", "> 1e9"));
    assert_eq!(after.2, before.2);
    let no_wait = Plant {
        alert: "LeaseholdNoLeader",
        change: PlantedChange::For("0s"),
    };
    let (before, after) = changed(1, &no_wait);
    assert_eq!(before.1, after.1);
    assert_eq!((before.2.as_str(), after.2.as_str()), ("120s", "0s"));
}

#[test]
fn grafana_variables_are_substituted_and_no_other() {
    let expr = "sum(rate(m{namespace=~\"$namespace\", lease=~\"${lease}\"}[$__rate_interval]))";
    assert_eq!(
        grafana_interpolated(expr, &[("namespace", "e2e-a"), ("lease", "scheduler")]),
        "sum(rate(m{namespace=~\"e2e-a\", lease=~\"scheduler\"}[4s]))"
    );
    let unknown = std::panic::catch_unwind(|| grafana_interpolated("m[$__range]", &[]));
    assert!(unknown.is_err(), "an unknown variable passed");
    assert!(!panel_queries(&dashboard()).is_empty());
}
