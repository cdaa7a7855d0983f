//! `leasehold inject`: the webhook's injection, offline. Reads Kubernetes
//! YAML (several documents, `List`s), injects the sidecar into every Pod and
//! pod template annotated `leasehold.dev/lease` with the same patch the
//! webhook sends, and says what it skipped and why. For GitOps, and to see
//! what the webhook will do.

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use crate::operator::webhook::{
    DEFAULT_IMAGE, InjectionConfig, LEASE_ANNOTATION, LeaseInjection, NotInjected, SidecarArgs, injection_patch,
};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// YAML files to read; none or "-": standard input.
    pub files: Vec<PathBuf>,
    #[command(flatten)]
    pub sidecar: SidecarArgs,
}

impl Args {
    pub fn injection(&self) -> InjectionConfig {
        self.sidecar.injection(DEFAULT_IMAGE.to_string())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
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
pub struct Injected {
    pub yaml: String,
    pub notes: Vec<String>,
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
pub fn inject(input: &str, config: &InjectionConfig) -> Result<Injected, Error> {
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
            (key, LeaseInjection { readiness_gate: gate.unwrap_or(false) })
        })
        .collect();
    let mut out = Injected::default();
    for (index, mut doc) in docs.into_iter().enumerate() {
        let context = Context { index, leases: &leases, config };
        if doc["kind"] == "List" {
            for item in doc["items"].as_array_mut().into_iter().flatten() {
                context.one(item, &mut out.notes)?;
            }
        } else {
            context.one(&mut doc, &mut out.notes)?;
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
    doc.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("default")
}

struct Context<'a> {
    index: usize,
    leases: &'a BTreeMap<(String, String), LeaseInjection>,
    config: &'a InjectionConfig,
}

impl Context<'_> {
    fn one(&self, doc: &mut Value, notes: &mut Vec<String>) -> Result<(), Error> {
        let kind = doc["kind"].as_str().unwrap_or("(no kind)").to_string();
        let what = format!("{kind} {}/{}", namespace(doc), name(doc));
        let Some(pointer) = template_pointer(&kind) else {
            notes.push(format!("{what}: skipped: not a Pod or a workload with a pod template"));
            return Ok(());
        };
        let namespace = namespace(doc).to_string();
        let annotation = format!("/metadata/annotations/{}", LEASE_ANNOTATION.replace('/', "~1"));
        let on_workload = !pointer.is_empty() && doc.pointer(&annotation).is_some();
        let Some(template) = doc.pointer_mut(pointer) else {
            notes.push(format!("{what}: skipped: no pod template at {pointer}"));
            return Ok(());
        };
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": template["metadata"], "spec": template["spec"]});
        let typed: Pod = serde_json::from_value(pod.clone()).map_err(|source| Error::Template {
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
        let lease = self.leases.get(&(namespace.clone(), lease_name.clone())).copied();
        match injection_patch(&typed, lease, self.config) {
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
                notes.push(format!("{what}: injected (lease {lease_name}; {gate})"));
            }
            Err(NotInjected::NotAnnotated) if on_workload => notes.push(format!(
                "{what}: skipped: {LEASE_ANNOTATION} is on the {kind} itself; put it on the pod template ({pointer}/metadata/annotations)"
            )),
            Err(reason) => notes.push(format!("{what}: skipped: {reason}")),
        }
        Ok(())
    }
}
