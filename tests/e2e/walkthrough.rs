//! The README's walkthrough ("From nothing to a leader"), run as written:
//! its `sh e2e` blocks in order in one bash shell, with `kubectl`, a `helm`
//! whose `install` renders the chart with real Helm (helm-python-sdk) and
//! applies it by server-side apply after the chart's CRDs; the lease lives
//! in a Kubernetes Lease. The watcher follows the leader-only part; after
//! the script, one leader label, one endpoint, and in the gated variant one
//! Ready pod, which the lease's status names as holder with the token of
//! its Lease.

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use leasehold::api::DistributedLease;
use leasehold::store::kubernetes::{RECORD_ANNOTATION, lease_name};

use crate::e2e::cluster::{repo, wait_for, walkthrough};
use crate::e2e::fixtures::{APP, ready_pods};
use crate::e2e::watcher::{LeadershipWatcher, Watched};

use crate::support::readme;

/// The walkthrough's namespace, as the README names it.
const NAMESPACE: &str = "my-app";

/// `helm install RELEASE CHART [flags]`, and `helm upgrade RELEASE CHART
/// --reuse-values` (the install's values, kept in `$HELM_VALUES`; like
/// Helm, an upgrade leaves `crds/` alone), as far as the README uses them.
pub const HELM: &str = r#"
helm() {
  local verb=$1
  case $verb in install|upgrade) ;; *) echo "the suite's helm does install and upgrade only" >&2; return 2 ;; esac
  local release=$2 chart=$3 namespace=default args=()
  shift 3
  while [ $# -gt 0 ]; do
    case $1 in
      --namespace|-n) namespace=$2; shift 2 ;;
      --create-namespace) shift ;;
      --reuse-values) while IFS= read -r arg; do args+=("$arg"); done < "$HELM_VALUES"; shift ;;
      *) args+=("$1"); shift ;;
    esac
  done
  if [ "$verb" = install ]; then
    printf '%s\n' "${args[@]}" > "$HELM_VALUES"
    kubectl create namespace "$namespace" --dry-run=client -o yaml | kubectl apply --server-side -f - >/dev/null
    kubectl apply --server-side --force-conflicts -f "$chart/crds" >/dev/null
  fi
  "$VENV_PYTHON" scripts/helm-template.py "$release" "$chart" -n "$namespace" "${args[@]}" \
    | kubectl apply --server-side --force-conflicts --field-manager leasehold-e2e -f - >/dev/null
}
"#;

/// A bash running `script` from the repository root with the suite's
/// `helm`, kubectl on PATH and the cluster's kubeconfig.
pub fn bash(s: &crate::e2e::cluster::Scenario, script: &str) -> Command {
    let kubectl_dir = repo().join(".venv/bin");
    let mut bash = Command::new("bash");
    bash.arg("-c")
        .arg(format!("{HELM}\n{script}"))
        .current_dir(repo())
        .env(
            "PATH",
            format!(
                "{}:{}",
                kubectl_dir.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .env("KUBECONFIG", &s.env.kubeconfig)
        .env("VENV_PYTHON", kubectl_dir.join("python"))
        .env(
            "HELM_VALUES",
            std::env::temp_dir().join(format!("leasehold-e2e-helm-values-{}", s.ns)),
        );
    bash
}

/// The README's walkthrough installs the chart with the README's values, over the suite's install: nextest runs them alone, where no other test uses the cluster.
mod disruptive {
    use super::*;

    #[tokio::test]
    async fn the_readme_walkthrough_runs_as_written() {
        walkthrough(NAMESPACE, |s| async move {
            let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
            let script = readme::e2e_script(&readme);
            let watcher = LeadershipWatcher::start(
                &s.client,
                Watched {
                    ns: NAMESPACE,
                    pods: APP,
                    service: Some("scheduler-leader"),
                    lease: Some("scheduler"),
                },
            );
            // The script runs for minutes: on a thread of its own, so the
            // test's runtime (one thread, #[tokio::test]) goes on running the
            // watcher's watches and claim readers meanwhile.
            let mut bash = bash(&s, &script);
            let out = tokio::task::spawn_blocking(move || bash.output())
                .await
                .expect("the walkthrough's thread")
                .expect("running the walkthrough with bash");
            assert!(
                out.status.success(),
                "the README's walkthrough failed:\n{}\n{}\n--- script ---\n{script}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            // The gated variant replaced the leader-only Deployment: one Ready pod, the leader.
            let ready = wait_for("one Ready pod, the leader", Duration::from_secs(60), || async {
                let ready = ready_pods(&s).await;
                let leaders = watcher.leaders();
                (ready.len() == 1 && leaders == ready).then_some(ready)
            })
            .await;
            assert_eq!(ready.len(), 1);
            // The operator reads the lock's Lease in my-app (its stores Role) into
            // status: that pod holds it, with the token the Lease records.
            let leases: Api<Lease> = Api::namespaced(s.client.clone(), NAMESPACE);
            let dleases: Api<DistributedLease> = Api::namespaced(s.client.clone(), NAMESPACE);
            let holder = format!("{NAMESPACE}/{}#", ready[0]);
            wait_for(
                "the status naming the leader and its Lease's token",
                Duration::from_secs(60),
                || async {
                    let lease = leases
                        .get_opt(&lease_name(&format!("{NAMESPACE}/scheduler")))
                        .await
                        .ok()??;
                    let record = lease.metadata.annotations?.remove(RECORD_ANNOTATION)?;
                    let token = serde_json::from_str::<serde_json::Value>(&record).ok()?["token"].as_i64()?;
                    let status = dleases.get("scheduler").await.ok()?.status?;
                    let store_ready = status
                        .conditions
                        .iter()
                        .any(|c| c.type_ == "StoreReady" && c.status == "True");
                    (store_ready
                        && status.holder.is_some_and(|h| h.starts_with(&holder))
                        && status.token == Some(token.to_string()))
                    .then_some(())
                },
            )
            .await;
            assert!(
                watcher.moves() <= 1,
                "the leader moved at most once, to the gated variant"
            );
            // The leader-only part's leader was gone before the script
            // ended: its claim was read while the script ran.
            let claimants = watcher.claimants();
            assert!(
                claimants.iter().any(|pod| *pod != ready[0]),
                "the watcher read no claim during the leader-only part, only {claimants:?}"
            );
            watcher.finish();
        })
        .await;
    }
}
