//! `leasehold transfer LEASE --to POD` (and `kubectl leasehold transfer`):
//! asks the leader of a DistributedLease to hand over to a named pod, by
//! creating a `LeaseTransfer` the leader's sidecar acts on
//! (docs/transfer.md). With `--wait` it returns when the leader has
//! answered: exit 0 when the target leads, 1 when the transfer failed
//! (the reason is printed), 2 when no answer came within `--timeout`.

use std::time::Duration;

use kube::api::{ObjectMeta, PostParams};
use kube::runtime::wait::await_condition;
use kube::{Api, ResourceExt};

use super::ClusterArgs;
use crate::api::transfer::{LeaseTransfer, LeaseTransferSpec, TransferOrigin, TransferPhase};
use crate::rbac::Rule;

/// What a person or program needs to request transfers in a namespace, and
/// nothing about the DistributedLease itself: create the request and watch
/// its status (`--wait`). The chart's `<release>-transfer` ClusterRole
/// carries exactly these, for a RoleBinding per namespace.
pub const RULES: &[Rule] = &[Rule {
    api_group: "leasehold.dev",
    resources: &["leasetransfers"],
    verbs: &["create", "get", "list", "watch"],
    resource_names: &[],
}];

/// Exit code: the transfer failed (refused, or the target did not take over).
pub(crate) const EXIT_FAILED: i32 = 1;
/// Exit code: no answer within `--timeout`.
pub(crate) const EXIT_NO_ANSWER: i32 = 2;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The DistributedLease whose leader hands over.
    #[arg(env = "LEASEHOLD_TRANSFER_LEASE")]
    pub lease: String,
    /// The pod to hand leadership to: a ready candidate of the lease.
    #[arg(long, env = "LEASEHOLD_TRANSFER_TO", value_name = "POD")]
    pub to: String,
    /// The namespace of the lease and the pod (default: the kubeconfig context's).
    #[arg(short, long, env = "LEASEHOLD_TRANSFER_NAMESPACE")]
    pub namespace: Option<String>,
    /// Return only when the leader answered: exit 0 when the target leads,
    /// 1 when the transfer failed, 2 on timeout.
    #[arg(long, env = "LEASEHOLD_TRANSFER_WAIT")]
    pub wait: bool,
    /// How long `--wait` waits for the answer.
    #[arg(long, env = "LEASEHOLD_TRANSFER_TIMEOUT", value_parser = crate::lease::timing::parse_duration_flag, default_value = "2m")]
    pub timeout: Duration,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Client(#[from] crate::api::client::ClientError),
    #[error("cannot create the LeaseTransfer in namespace {namespace}")]
    Create {
        namespace: String,
        #[source]
        source: kube::Error,
    },
    #[error("watching LeaseTransfer {name} failed")]
    Watch {
        name: String,
        #[source]
        source: kube::runtime::wait::Error,
    },
}

/// `leasehold transfer`: the process's exit code.
pub async fn run(args: Args) -> Result<i32, Error> {
    let client = args.cluster.client().await?;
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let api: Api<LeaseTransfer> = Api::namespaced(client, &namespace);
    let request = LeaseTransfer {
        metadata: ObjectMeta {
            // The API server appends a random suffix (and shortens the prefix
            // to fit), so every request is an object of its own.
            generate_name: Some(format!("{}-to-{}-", args.lease, args.to)),
            ..ObjectMeta::default()
        },
        spec: LeaseTransferSpec {
            lease: args.lease.clone(),
            to: args.to.clone(),
            origin: Some(TransferOrigin::Manual),
        },
        status: None,
    };
    let created = api
        .create(&PostParams::default(), &request)
        .await
        .map_err(|source| Error::Create {
            namespace: namespace.clone(),
            source,
        })?;
    let name = created.name_any();
    println!("leasetransfer/{name} created: lease {} to pod {}", args.lease, args.to);
    if !args.wait {
        return Ok(0);
    }
    let answered = |t: Option<&LeaseTransfer>| phase(t).is_some_and(TransferPhase::is_final);
    let done = tokio::time::timeout(args.timeout, await_condition(api, &name, answered)).await;
    let done = match done {
        Ok(done) => done.map_err(|source| Error::Watch {
            name: name.clone(),
            source,
        })?,
        Err(_) => {
            eprintln!(
                "no answer within {}: is the lease's leader running a sidecar that may watch LeaseTransfers \
                 (docs/rbac-sidecar.md)? `kubectl get leasetransfer {name} -n {namespace}` shows the status",
                humantime::format_duration(args.timeout)
            );
            return Ok(EXIT_NO_ANSWER);
        }
    };
    Ok(answer(done.as_ref()))
}

fn phase(transfer: Option<&LeaseTransfer>) -> Option<TransferPhase> {
    transfer.and_then(|t| t.status.as_ref()).and_then(|s| s.phase)
}

/// Prints the leader's answer; the exit code says whether the target leads.
fn answer(transfer: Option<&LeaseTransfer>) -> i32 {
    let status = transfer.and_then(|t| t.status.clone()).unwrap_or_default();
    let message = status.message.unwrap_or_default();
    match status.phase {
        Some(TransferPhase::Transferred) => {
            println!("transferred: {message}");
            0
        }
        _ => {
            let reason = status.reason.unwrap_or_else(|| "Deleted".into());
            eprintln!("transfer failed: {reason}: {message}");
            EXIT_FAILED
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::testing::api::ApiServer;

    const TRANSFERS: &str = "/apis/leasehold.dev/v1alpha1/namespaces/prod/leasetransfers";

    /// The command's requests are exactly what [`RULES`] grants.
    fn allowed(method: &str, path: &str, watch: bool) -> bool {
        crate::rbac::request_attributes(method, path, watch).is_some_and(|r| crate::rbac::grants(RULES, &r))
    }

    /// `leasehold transfer web --to web-1 --wait` against the API server
    /// model over HTTP (a kubeconfig naming it, namespace prod); `answer`
    /// is the status a leader would write, if any.
    async fn transfer(answer: Option<serde_json::Value>, timeout: Duration) -> (i32, ApiServer) {
        let server = ApiServer::new(Some(allowed));
        let addr = server.serve_http().await;
        let dir = std::env::temp_dir().join(format!("leasehold-transfer-{}-{}", std::process::id(), addr.port()));
        std::fs::create_dir_all(&dir).unwrap();
        let kubeconfig = dir.join("config");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters: [{{name: m, cluster: {{server: 'http://{addr}'}}}}]\n\
                 contexts: [{{name: m, context: {{cluster: m, user: u, namespace: prod}}}}]\n\
                 current-context: m\nusers: [{{name: u, user: {{}}}}]\n"
            ),
        )
        .unwrap();
        let args = Args {
            lease: "web".into(),
            to: "web-1".into(),
            namespace: None,
            wait: true,
            timeout,
            cluster: ClusterArgs {
                kubeconfig: Some(kubeconfig.to_string_lossy().into_owned()),
                context: None,
            },
        };
        let leader = server.clone();
        tokio::spawn(async move {
            // As the leader's sidecar: answer the request once it exists.
            leader.wait_for_requests(1).await;
            let api: Api<LeaseTransfer> = Api::namespaced(leader.client("prod"), "prod");
            let created = api.list(&Default::default()).await.unwrap().items.remove(0);
            if let Some(status) = answer {
                let mut object = serde_json::to_value(&created).unwrap();
                object["status"] = status;
                leader.insert(TRANSFERS, object);
            }
        });
        let code = run(args).await.unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        (code, server)
    }

    #[tokio::test]
    async fn wait_exits_0_when_the_target_leads() {
        let status = json!({"phase": "Transferred", "reason": "TargetLeads", "message": "pod web-1 leads term 2"});
        let (code, server) = transfer(Some(status), Duration::from_secs(60)).await;
        assert_eq!(code, 0);
        let api: Api<LeaseTransfer> = Api::namespaced(server.client("prod"), "prod");
        let request = api.list(&Default::default()).await.unwrap().items.remove(0);
        assert_eq!(
            request.spec,
            LeaseTransferSpec {
                lease: "web".into(),
                to: "web-1".into(),
                origin: Some(TransferOrigin::Manual),
            }
        );
        assert!(
            request.name_any().starts_with("web-to-web-1-"),
            "{}",
            request.name_any()
        );
        assert!(server.forbidden().is_empty(), "{:?}", server.forbidden());
    }

    #[tokio::test]
    async fn wait_exits_1_when_refused() {
        let status =
            json!({"phase": "TransferFailed", "reason": "TargetNotReady", "message": "pod web-1 is not ready"});
        assert_eq!(transfer(Some(status), Duration::from_secs(60)).await.0, EXIT_FAILED);
    }

    /// Not a timed assertion: the bound is the flag's value, and nobody answers.
    #[tokio::test]
    async fn wait_exits_2_without_an_answer() {
        assert_eq!(transfer(None, Duration::from_millis(500)).await.0, EXIT_NO_ANSWER);
    }
}
