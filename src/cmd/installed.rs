//! An install of leasehold in a cluster, found by the labels the chart (and
//! manifests/install.yaml, rendered from it) puts on the operator's
//! Deployment, whatever the release is called: `check` reads its names from
//! it and `version` its image.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

use crate::api::contract::NAME_LABEL;

/// With [`NAME_LABEL`], the chart's selector labels of the operator.
pub(crate) const COMPONENT_LABEL: (&str, &str) = ("app.kubernetes.io/component", "operator");
/// The Helm release, `app.kubernetes.io/instance`.
pub(crate) const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";

/// One operator Deployment and what its container is configured with.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Operator {
    pub namespace: String,
    pub name: String,
    /// The Helm release (`app.kubernetes.io/instance`).
    pub instance: Option<String>,
    pub image: Option<String>,
    /// The operator container's literal environment (the chart passes every
    /// setting as a `LEASEHOLD_…` variable).
    pub env: BTreeMap<String, String>,
}

impl Operator {
    fn of(deployment: &Deployment) -> Self {
        let container = deployment
            .spec
            .template
            .spec
            .as_ref()
            .and_then(|s| s.containers.first());
        let env = container
            .and_then(|c| c.env.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
            .collect();
        Operator {
            namespace: deployment.namespace().unwrap_or_default(),
            name: deployment.name_any(),
            instance: deployment.labels().get(INSTANCE_LABEL).cloned(),
            image: container.and_then(|c| c.image.clone()),
            env,
        }
    }

    /// The tag (or digest) of its image: the version it runs.
    pub(crate) fn version(&self) -> Option<&str> {
        let image = self.image.as_deref()?;
        if let Some((_, digest)) = image.split_once('@') {
            return Some(digest);
        }
        let last = image.rsplit('/').next()?;
        last.split_once(':').map(|(_, tag)| tag)
    }

    pub(crate) fn id(&self) -> String {
        format!("Deployment {}/{}", self.namespace, self.name)
    }
}

/// The label selector of the operator Deployments, of one release when `instance` is given.
pub(crate) fn selector(instance: Option<&str>) -> String {
    let mut terms = vec![
        format!("{}={}", NAME_LABEL.0, NAME_LABEL.1),
        format!("{}={}", COMPONENT_LABEL.0, COMPONENT_LABEL.1),
    ];
    terms.extend(instance.map(|i| format!("{INSTANCE_LABEL}={i}")));
    terms.join(",")
}

/// The operator Deployments in `namespace` (default: every namespace), of
/// release `instance` when given, sorted by namespace and name.
pub(crate) async fn operators(
    client: &Client,
    namespace: Option<&str>,
    instance: Option<&str>,
) -> Result<Vec<Operator>, kube::Error> {
    let api: Api<Deployment> = match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    };
    let list = api.list(&ListParams::default().labels(&selector(instance))).await?;
    let mut found: Vec<Operator> = list.items.iter().map(Operator::of).collect();
    found.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn operator(image: &str) -> Operator {
        Operator {
            namespace: "ns".into(),
            name: "x".into(),
            instance: None,
            image: Some(image.into()),
            env: BTreeMap::new(),
        }
    }

    #[test]
    fn the_version_is_the_image_tag_or_digest() {
        assert_eq!(operator("ghcr.io/leasehold/leasehold:0.1.0").version(), Some("0.1.0"));
        assert_eq!(operator("localhost:5000/leasehold:dev").version(), Some("dev"));
        assert_eq!(operator("leasehold@sha256:ab").version(), Some("sha256:ab"));
        assert_eq!(operator("localhost:5000/leasehold").version(), None);
    }

    #[test]
    fn the_selector_names_the_release_when_given() {
        assert_eq!(
            selector(Some("other")),
            "app.kubernetes.io/name=leasehold,app.kubernetes.io/component=operator,app.kubernetes.io/instance=other"
        );
    }
}
