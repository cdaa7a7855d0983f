//! `leasehold inject`: the webhook's injection, offline. Reads Kubernetes
//! YAML (several documents, `List`s), injects the sidecar into every Pod and
//! pod template annotated `leasehold.dev/lease` (or, with `leasehold.dev/run`,
//! wraps the named container's command with `leasehold run`) with the same
//! patch the webhook sends, and says what it skipped and why. For GitOps, and to see
//! what the webhook will do.

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use crate::api::contract::{DEFAULT_IMAGE, ENV_CLUSTER_NAME, LEASE_ANNOTATION, RUN_ANNOTATION};
use crate::lease::parse_cluster_name;
use crate::operator::webhook::{InjectionConfig, LeaseInjection, NotInjected, SidecarArgs, injection_patch};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// YAML files to read; none or "-": standard input.
    pub files: Vec<PathBuf>,
    /// This cluster's name, which every injected sidecar puts first in its
    /// holder identity (as the operator's webhook does with its own).
    #[arg(long, env = ENV_CLUSTER_NAME, value_parser = parse_cluster_name)]
    pub cluster_name: Option<String>,
    #[command(flatten)]
    pub sidecar: SidecarArgs,
}

impl Args {
    pub(crate) fn injection(&self) -> InjectionConfig {
        self.sidecar
            .injection(DEFAULT_IMAGE.to_string(), self.cluster_name.clone())
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error("document {index}: not YAML")]
    Parse {
        index: usize,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("document {index} ({what}): the pod template does not read as a Pod")]
    Template {
        index: usize,
        what: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("document {index} ({what}): the injection patch does not apply")]
    Patch {
        index: usize,
        what: String,
        #[source]
        source: json_patch::PatchError,
    },
    #[error("writing YAML")]
    Write(#[source] serde_yaml::Error),
}

/// The YAML out and one line per document about what happened to it.
#[derive(Debug, Default)]
pub(crate) struct Injected {
    pub yaml: String,
    pub notes: Vec<String>,
    /// Templates that ask for injection but cannot have it (a bad annotation).
    pub refused: usize,
}

/// Where the pod template sits in each kind that has one.
fn template_pointer(kind: &str) -> Option<&'static str> {
    match kind {
        "Pod" => Some(""),
        "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "Job" | "ReplicationController" => {
            Some("/spec/template")
        }
        "CronJob" => Some("/spec/jobTemplate/spec/template"),
        _ => None,
    }
}

/// Injects every annotated pod template in `input` (YAML, several documents).
pub(crate) fn inject(input: &str, config: &InjectionConfig) -> Result<Injected, Error> {
    use serde::Deserialize;
    let mut docs = Vec::new();
    for (index, document) in serde_yaml::Deserializer::from_str(input).enumerate() {
        let doc = Value::deserialize(document).map_err(|source| Error::Parse { index, source })?;
        if !doc.is_null() {
            docs.push(doc);
        }
    }
    // The readiness gate comes from the lease: use the DistributedLeases in
    // the same input, as the webhook would read them from the cluster.
    let leases: BTreeMap<(String, String), LeaseInjection> = docs
        .iter()
        .flat_map(|d| items(d))
        .filter(|d| d["kind"] == "DistributedLease")
        .map(|d| {
            let key = (namespace(d).to_string(), name(d).to_string());
            let gate = d.pointer("/spec/publishing/readinessGate").and_then(Value::as_bool);
            let store = d
                .pointer("/spec/store")
                .and_then(|s| serde_json::from_value::<crate::api::LeaseStoreSpec>(s.clone()).ok());
            (key, LeaseInjection::new(gate.unwrap_or(false), store.as_ref()))
        })
        .collect();
    let mut out = Injected::default();
    for (index, mut doc) in docs.into_iter().enumerate() {
        let context = Context {
            index,
            leases: &leases,
            config,
        };
        if doc["kind"] == "List" {
            for item in doc["items"].as_array_mut().into_iter().flatten() {
                context.one(item, &mut out)?;
            }
        } else {
            context.one(&mut doc, &mut out)?;
        }
        out.yaml.push_str("---\n");
        out.yaml.push_str(&serde_yaml::to_string(&doc).map_err(Error::Write)?);
    }
    Ok(out)
}

fn items(doc: &Value) -> Vec<&Value> {
    match doc["items"].as_array() {
        Some(items) if doc["kind"] == "List" => items.iter().collect(),
        _ => vec![doc],
    }
}

fn name(doc: &Value) -> &str {
    doc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("")
}

fn namespace(doc: &Value) -> &str {
    doc.pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("default")
}

struct Context<'a> {
    index: usize,
    leases: &'a BTreeMap<(String, String), LeaseInjection>,
    config: &'a InjectionConfig,
}

impl Context<'_> {
    fn one(&self, doc: &mut Value, out: &mut Injected) -> Result<(), Error> {
        let kind = doc["kind"].as_str().unwrap_or("(no kind)").to_string();
        let what = format!("{kind} {}/{}", namespace(doc), name(doc));
        let Some(pointer) = template_pointer(&kind) else {
            out.notes
                .push(format!("{what}: skipped: not a Pod or a workload with a pod template"));
            return Ok(());
        };
        let namespace = namespace(doc).to_string();
        let annotation = format!("/metadata/annotations/{}", LEASE_ANNOTATION.replace('/', "~1"));
        let on_workload = !pointer.is_empty() && doc.pointer(&annotation).is_some();
        let Some(template) = doc.pointer_mut(pointer) else {
            out.notes.push(format!("{what}: skipped: no pod template at {pointer}"));
            return Ok(());
        };
        let mut pod =
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": template["metadata"], "spec": template["spec"]});
        let typed: Pod = crate::api::client::object_from_value(&pod).map_err(|source| Error::Template {
            index: self.index,
            what: what.clone(),
            source,
        })?;
        let lease_name = typed
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(LEASE_ANNOTATION))
            .cloned()
            .unwrap_or_default();
        let lease = self.leases.get(&(namespace.clone(), lease_name.clone())).cloned();
        match injection_patch(&typed, lease.clone(), self.config) {
            Ok(patch) => {
                json_patch::patch(&mut pod, &patch).map_err(|source| Error::Patch {
                    index: self.index,
                    what: what.clone(),
                    source,
                })?;
                template["spec"] = pod["spec"].take();
                let gate = match lease {
                    Some(lease) if lease.readiness_gate => "with the readiness gate",
                    Some(_) => "no readiness gate (the lease asks for none)",
                    None => "no readiness gate added: its DistributedLease is not in the input",
                };
                let wrapped = typed.metadata.annotations.as_ref().and_then(|a| a.get(RUN_ANNOTATION));
                out.notes.push(match wrapped {
                    Some(container) => {
                        format!("{what}: injected: container {container} runs under leasehold run (lease {lease_name}; {gate})")
                    }
                    None => format!("{what}: injected (lease {lease_name}; {gate})"),
                });
            }
            Err(NotInjected::NotAnnotated) if on_workload => out.notes.push(format!(
                "{what}: skipped: {LEASE_ANNOTATION} is on the {kind} itself; put it on the pod template ({pointer}/metadata/annotations)"
            )),
            Err(reason) => {
                out.refused += usize::from(reason.is_user_error());
                out.notes.push(format!("{what}: skipped: {reason}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::contract::SIDECAR_CONTAINER;

    /// The defaults of `leasehold inject`'s flags.
    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn config() -> InjectionConfig {
        <Cli as clap::Parser>::parse_from(["inject"]).args.injection()
    }

    /// Issue 37: `inject --cluster-name` (or LEASEHOLD_CLUSTER_NAME) gives
    /// the sidecars the name the operator's webhook would; a bad name is
    /// refused with the one message of `parse_cluster_name`.
    #[test]
    fn the_cluster_name_reaches_the_injected_sidecars() {
        let config = <Cli as clap::Parser>::parse_from(["inject", "--cluster-name", "eu"])
            .args
            .injection();
        let out = inject(INPUT, &config).unwrap();
        let sidecar = &docs(&out.yaml)[0]["spec"]["template"]["spec"]["initContainers"][0];
        let env = sidecar["env"].as_array().unwrap();
        assert!(
            env.contains(&json!({"name": ENV_CLUSTER_NAME, "value": "eu"})),
            "{env:?}"
        );
        let err = <Cli as clap::Parser>::try_parse_from(["inject", "--cluster-name", "eu/west"]).unwrap_err();
        assert!(err.to_string().contains("cluster name \"eu/west\" must be"), "{err}");
    }

    const INPUT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata:
      labels: {app: web}
      annotations: {leasehold.dev/lease: web}
    spec:
      containers: [{name: app, image: "web:1"}]
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: report, namespace: shop}
spec:
  schedule: "@hourly"
  jobTemplate:
    spec:
      template:
        metadata: {annotations: {leasehold.dev/lease: report}}
        spec:
          restartPolicy: Never
          containers: [{name: job, image: "report:1"}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: shop}
data: {a: b}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db, namespace: shop, annotations: {leasehold.dev/lease: db}}
spec:
  serviceName: db
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      containers: [{name: db, image: "db:1"}]
---
apiVersion: leasehold.dev/v1alpha1
kind: DistributedLease
metadata: {name: web, namespace: shop}
spec:
  publishing: {readinessGate: true}
"#;

    fn docs(yaml: &str) -> Vec<Value> {
        use serde::Deserialize;
        serde_yaml::Deserializer::from_str(yaml)
            .map(|d| Value::deserialize(d).unwrap())
            .filter(|d| !d.is_null())
            .collect()
    }

    #[test]
    fn annotated_templates_of_every_kind_get_the_webhook_patch_and_the_rest_is_explained() {
        let out = inject(INPUT, &config()).unwrap();
        let docs = docs(&out.yaml);
        assert_eq!(docs.len(), 5, "every document is written back");
        let web = &docs[0]["spec"]["template"]["spec"];
        assert_eq!(web["initContainers"][0]["name"], SIDECAR_CONTAINER);
        assert_eq!(web["initContainers"][0]["restartPolicy"], "Always");
        assert_eq!(
            web["readinessGates"],
            json!([{"conditionType": "leasehold.dev/leader"}]),
            "the lease in the input asks for the gate"
        );
        let report = &docs[1]["spec"]["jobTemplate"]["spec"]["template"]["spec"];
        assert_eq!(report["initContainers"][0]["name"], SIDECAR_CONTAINER);
        assert!(report.get("readinessGates").is_none());
        assert_eq!(
            docs[2],
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "namespace": "shop"}, "data": {"a": "b"}})
        );
        assert!(docs[3]["spec"]["template"]["spec"].get("initContainers").is_none());
        assert_eq!(
            out.notes,
            [
                "Deployment shop/web: injected (lease web; with the readiness gate)",
                "CronJob shop/report: injected (lease report; no readiness gate added: its DistributedLease is not in the input)",
                "ConfigMap shop/settings: skipped: not a Pod or a workload with a pod template",
                "StatefulSet shop/db: skipped: leasehold.dev/lease is on the StatefulSet itself; put it on the pod template (/spec/template/metadata/annotations)",
                "DistributedLease shop/web: skipped: not a Pod or a workload with a pod template",
            ]
        );
    }

    #[test]
    fn the_same_patch_as_the_webhook() {
        let pod: Pod = crate::api::client::object_from_value(&json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "annotations": {LEASE_ANNOTATION: "l"}},
            "spec": {"containers": [{"name": "app", "image": "a"}]},
        }))
        .unwrap();
        let mut expected = serde_json::to_value(&pod).unwrap();
        json_patch::patch(&mut expected, &injection_patch(&pod, None, &config()).unwrap()).unwrap();
        let out = inject(&serde_yaml::to_string(&pod).unwrap(), &config()).unwrap();
        assert_eq!(docs(&out.yaml), [expected]);
    }

    #[test]
    fn injecting_twice_changes_nothing_and_lists_are_read_item_by_item() {
        let once = inject(INPUT, &config()).unwrap();
        let twice = inject(&once.yaml, &config()).unwrap();
        assert_eq!(docs(&twice.yaml), docs(&once.yaml));
        assert!(
            twice.notes[0].ends_with("skipped: it already has a container named leasehold"),
            "{:?}",
            twice.notes
        );
        let list = json!({"apiVersion": "v1", "kind": "List", "items": docs(INPUT)});
        let from_list = inject(&serde_yaml::to_string(&list).unwrap(), &config()).unwrap();
        assert_eq!(
            docs(&from_list.yaml)[0]["items"].as_array().unwrap().as_slice(),
            docs(&once.yaml).as_slice()
        );
    }

    #[test]
    fn a_bad_annotation_is_counted_as_refused() {
        let input = INPUT.replace(
            "annotations: {leasehold.dev/lease: web}",
            "annotations: {leasehold.dev/lease: web, leasehold.dev/app-container: nope}",
        );
        let out = inject(&input, &config()).unwrap();
        assert_eq!(out.refused, 1);
        assert_eq!(
            out.notes[0],
            "Deployment shop/web: skipped: annotation leasehold.dev/app-container: the pod has no container \"nope\""
        );
        assert_eq!(inject(INPUT, &config()).unwrap().refused, 0);
    }

    const RUN_JOB: &str = r#"
apiVersion: batch/v1
kind: CronJob
metadata: {name: report, namespace: shop}
spec:
  schedule: "@hourly"
  jobTemplate:
    spec:
      template:
        metadata: {annotations: {leasehold.dev/lease: report, leasehold.dev/run: job}}
        spec:
          restartPolicy: Never
          containers: [{name: job, image: "report:1", command: [/app/report], args: [--since, yesterday]}]
"#;

    #[test]
    fn a_run_template_is_wrapped_once_and_one_without_a_command_is_refused() {
        let once = inject(RUN_JOB, &config()).unwrap();
        assert_eq!(
            once.notes,
            [
                "CronJob shop/report: injected: container job runs under leasehold run (lease report; no readiness gate added: its DistributedLease is not in the input)"
            ]
        );
        let spec = &docs(&once.yaml)[0]["spec"]["jobTemplate"]["spec"]["template"]["spec"];
        assert_eq!(
            spec["containers"][0]["command"],
            json!([
                "/leasehold/bin/leasehold",
                "run",
                "--lease",
                "report",
                "--",
                "/app/report",
                "--since",
                "yesterday"
            ])
        );
        assert_eq!(spec["initContainers"][0]["name"], "leasehold-install");
        let twice = inject(&once.yaml, &config()).unwrap();
        assert_eq!(docs(&twice.yaml), docs(&once.yaml));
        assert_eq!(
            twice.notes,
            ["CronJob shop/report: skipped: it already has a container named leasehold-install"]
        );
        let no_command = RUN_JOB.replace("command: [/app/report], ", "");
        let refused = inject(&no_command, &config()).unwrap();
        assert_eq!(refused.refused, 1);
        assert!(
            refused.notes[0].contains("container \"job\" has no command") && refused.notes[0].contains("set command:"),
            "{:?}",
            refused.notes
        );
        assert_eq!(
            docs(&refused.yaml),
            docs(&no_command),
            "a refused template is written back unchanged"
        );
    }

    /// Every variable the injection sets is one the sidecar reads (its clap
    /// `env`), and every value parses as that flag: one owner for names and
    /// formats. Tested here, above both roles: the operator's patch (the
    /// webhook's, `the_same_patch_as_the_webhook`) read by the sidecar's flags.
    #[test]
    fn the_injected_environment_is_what_the_sidecar_reads() {
        use clap::CommandFactory;
        #[derive(clap::Parser)]
        struct Sidecar {
            #[command(flatten)]
            sidecar: crate::sidecar::Args,
        }
        let input = r#"
apiVersion: v1
kind: Pod
metadata: {name: app-0, namespace: prod, annotations: {leasehold.dev/lease: scheduler}}
spec:
  containers: [{name: app, image: "app:1"}]
---
apiVersion: leasehold.dev/v1alpha1
kind: DistributedLease
metadata: {name: scheduler, namespace: prod}
spec:
  store: {postgres: {urlSecretRef: {name: pg, key: dsn}}}
"#;
        let command = Sidecar::command();
        let out = inject(input, &config()).unwrap();
        let env = docs(&out.yaml)[0]["spec"]["initContainers"][0]["env"].clone();
        let mut args = vec!["sidecar".to_string()];
        for var in env.as_array().unwrap() {
            let name = var["name"].as_str().unwrap();
            let arg = command
                .get_arguments()
                .find(|a| a.get_env().is_some_and(|e| e == name))
                .unwrap_or_else(|| panic!("the sidecar reads no variable {name}"));
            if let Some(value) = var["value"].as_str() {
                args.push(format!("--{}={value}", arg.get_long().unwrap()));
            }
        }
        let parsed = <Sidecar as clap::Parser>::try_parse_from(&args).unwrap().sidecar;
        assert_eq!(parsed.http_addr.to_string(), "127.0.0.1:4040");
        assert_eq!(parsed.metrics_addr.to_string(), "0.0.0.0:4041");
        assert_eq!(parsed.app_container.as_deref(), Some("app"));
        assert_eq!(parsed.election.lease.as_deref(), Some("scheduler"));
        assert_eq!(
            parsed.election.store_url_file.as_deref(),
            Some(std::path::Path::new("/var/run/leasehold-store/url"))
        );
    }

    /// The same URL-Secret mount as the webhook, from the DistributedLease
    /// in the input.
    #[test]
    fn a_redis_lease_in_the_input_mounts_its_url_secret() {
        let input = r#"
apiVersion: v1
kind: Pod
metadata: {name: worker, namespace: shop, annotations: {leasehold.dev/lease: jobs}}
spec:
  containers: [{name: app, image: "worker:1"}]
---
apiVersion: leasehold.dev/v1alpha1
kind: DistributedLease
metadata: {name: jobs, namespace: shop}
spec:
  store: {redis: {urlSecretRef: {name: cache-url}}}
"#;
        let out = inject(input, &config()).unwrap();
        let spec = &docs(&out.yaml)[0]["spec"];
        assert_eq!(spec["volumes"][1]["secret"]["secretName"], "cache-url");
        assert_eq!(
            spec["volumes"][1]["secret"]["items"][0]["key"], "url",
            "the default key"
        );
        let env = spec["initContainers"][0]["env"].as_array().unwrap();
        assert!(
            env.iter()
                .any(|e| e["name"] == crate::api::contract::ENV_STORE_URL_FILE),
            "{env:?}"
        );
    }

    #[test]
    fn bad_yaml_names_the_document() {
        let err = inject("kind: Pod\n---\nkind: [unclosed\n", &config()).unwrap_err();
        assert!(err.to_string().starts_with("document 1: not YAML"), "{err}");
    }

    /// A template that is not a pod says so and what is wrong, once, with
    /// no position in a rendering the user never wrote.
    #[test]
    fn a_template_that_is_not_a_pod_names_the_document_and_the_fault() {
        let input = "kind: Pod\nmetadata: {name: a, namespace: shop, annotations: {leasehold.dev/lease: web}}\n\
                     spec: {containers: app}\n";
        let err = inject(input, &config()).unwrap_err();
        assert_eq!(
            crate::api::errors::message(&err),
            "document 0 (Pod shop/a): the pod template does not read as a Pod: invalid type: string \"app\", \
             expected a sequence"
        );
    }
}
