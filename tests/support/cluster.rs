//! A real Kubernetes API server for tests: the cluster of the end-to-end
//! suite, named by `LEASEHOLD_E2E_KUBECONFIG`, and a namespace per test
//! that is deleted when the test ends.
//!
//! Without the variable a test that needs the cluster fails, saying how to
//! get one: a store's conformance must never pass by not running.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

use leasehold::store::kubernetes::KubernetesStore;

/// The variable naming the kubeconfig of the test cluster.
pub(crate) const KUBECONFIG_ENV: &str = "LEASEHOLD_E2E_KUBECONFIG";

/// The client configuration of the test cluster.
pub async fn config() -> Config {
    let path = std::env::var(KUBECONFIG_ENV)
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| {
            panic!(
                "{KUBECONFIG_ENV} is not set: these tests need a Kubernetes API server (1.35 or later). \
             Start one, e.g. `kind create cluster --name leasehold` and \
             `kind get kubeconfig --name leasehold > /tmp/kind.kubeconfig`, then set \
             {KUBECONFIG_ENV}=/tmp/kind.kubeconfig"
            )
        });
    let kubeconfig = Kubeconfig::read_from(&path).unwrap_or_else(|e| panic!("{KUBECONFIG_ENV}={path}: {e}"));
    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{KUBECONFIG_ENV}={path}: {e}"))
}

/// The variable giving the test namespaces a prefix (default `leasehold-e2e`),
/// so that people sharing a cluster can tell theirs apart.
pub(crate) const NAMESPACE_PREFIX_ENV: &str = "LEASEHOLD_E2E_NAMESPACE_PREFIX";

/// A namespace of its own, `<prefix>-<what>-<random>`, deleted on drop.
pub struct TestNamespace {
    pub name: String,
    pub client: Client,
    config: Config,
}

impl TestNamespace {
    pub async fn create(what: &str) -> TestNamespace {
        let config = config().await;
        let client = Client::try_from(config.clone()).expect("a client of the test cluster");
        let prefix = std::env::var(NAMESPACE_PREFIX_ENV).unwrap_or_else(|_| "leasehold-e2e".into());
        let name = format!("{prefix}-{what}-{:08x}", rand::random::<u32>());
        let namespace = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
        TestNamespace { name, client, config }
    }
}

impl Drop for TestNamespace {
    /// Deletes the namespace on a thread and runtime of its own (the
    /// test's may be blocked by this very drop), with a client of its own.
    fn drop(&mut self) {
        let (config, name) = (self.config.clone(), self.name.clone());
        let deleting = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
            if let Ok(runtime) = runtime {
                runtime.block_on(async {
                    let Ok(client) = Client::try_from(config) else { return };
                    let api = Api::<Namespace>::all(client);
                    let _ = tokio::time::timeout(Duration::from_secs(10), api.delete(&name, &DeleteParams::default()))
                        .await;
                });
            }
        });
        let _ = deleting.join();
    }
}

/// `store` with the planted bug the conformance suite must catch: it writes
/// its Lease without the `resourceVersion` precondition, over whatever
/// version is current, again after each conflict (the API server refuses a
/// Lease update without a version: `AllowUnconditionalUpdate` is false in
/// Kubernetes' pkg/registry/coordination/lease/strategy.go; this is what an unconditional patch
/// does): last writer wins.
pub fn with_unconditional_writes(store: KubernetesStore) -> KubernetesStore {
    store.replacing_writes_with(Arc::new(|api: Api<Lease>, name: String, mut body: Lease| {
        Box::pin(async move {
            loop {
                let current = api.get(&name).await;
                body.metadata.resource_version = current.ok().and_then(|l| l.metadata.resource_version);
                match api.replace(&name, &PostParams::default(), &body).await {
                    Err(kube::Error::Api(status)) if status.code == 409 => continue,
                    written => return written,
                }
            }
        })
    }))
}
