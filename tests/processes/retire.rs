//! Issue 40 in one whole `leasehold sidecar` process, on the API server
//! model (`ApiServer::serve_http`) through a kubeconfig, with the lease on
//! the Kubernetes store (its Lease lives in the model too): a leading
//! sidecar whose DistributedLease is deleted stops claiming before it
//! releases, marks its pod retired-from the deleted uid, and once the lease
//! is created again (another uid, another lock) re-executes in place (same
//! process id, a new holder identity) and leads on the new lease.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use leasehold::api::contract::RETIRED_FROM_ANNOTATION;
use leasehold::store::kubernetes::lease_name;
use leasehold::testing::api::{ApiServer, pods};
use serde_json::{Value, json};

use crate::support::{get, model_kubeconfig, proxy_runtime, wait_for_ready_file};

const NAMESPACE: &str = "prod";
const LEASES: &str = "/apis/leasehold.dev/v1alpha1/namespaces/prod/distributedleases";
const KUBE_LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/prod/leases";

fn lease(uid: &str, lock: &str) -> Value {
    json!({"apiVersion": "leasehold.dev/v1alpha1", "kind": "DistributedLease",
           "metadata": {"name": "web", "namespace": NAMESPACE, "uid": uid},
           "spec": {"lockName": lock, "store": {"kubernetes": {}},
                    "leaseDuration": "2s", "renewDeadline": "1500ms", "retryPeriod": "300ms",
                    "selector": {"matchLabels": {"app": "web"}}}})
}

/// The holder of `lock`'s Lease in the model, if any.
fn lease_holder(api: &ApiServer, lock: &str) -> Option<String> {
    let lease = api.get(KUBE_LEASES, &lease_name(lock))?;
    lease["spec"]["holderIdentity"]
        .as_str()
        .filter(|h| !h.is_empty())
        .map(String::from)
}

/// Polls `check` every 10 ms until it gives a value, for at most `within`.
fn until<T>(what: &str, within: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(found) = check() {
            return found;
        }
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The sidecar process, killed when the test ends, also when it fails.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_sidecar_whose_lease_is_deleted_stops_claiming_releases_marks_its_pod_and_reexecs_onto_the_new_one() {
    let runtime = proxy_runtime();
    let api = ApiServer::new(Some(leasehold::sidecar::rbac::allows_request));
    api.insert(LEASES, lease("u-1", "prod/web"));
    api.insert(
        &pods::collection(NAMESPACE),
        pods::pod("web-0", NAMESPACE, json!({"app": "web"}), None),
    );
    let addr = runtime.block_on(api.serve_http());
    let kubeconfig = model_kubeconfig(addr, NAMESPACE, "retire");
    // Port 0: the process binds and says where in its ready file, which it
    // writes again after re-executing.
    let ready_file = std::env::temp_dir().join(format!("leasehold-retire-{:016x}.json", rand::random::<u64>()));
    let mut child = Running(
        Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args(["sidecar", "--lease", "web"])
            .args(["--http-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"])
            .arg("--ready-file")
            .arg(&ready_file)
            .env("LEASEHOLD_KUBERNETES", "true")
            .env("POD_NAME", "web-0")
            .env("POD_NAMESPACE", NAMESPACE)
            .env("KUBECONFIG", &kubeconfig)
            .env("LEASEHOLD_DRAIN", "200ms")
            .env("LEASEHOLD_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .expect("leasehold sidecar starts"),
    );
    let pid = child.0.id();
    let http = wait_for_ready_file("web-0", &ready_file, &mut child.0).http.port();
    let leading = |port: u16| {
        get(port, "/leader")
            .ok()
            .filter(|(status, _)| *status == 200)
            .map(|(_, view)| view)
    };

    let first = until("the sidecar leads on lock prod/web", Duration::from_secs(20), || {
        leading(http)
    });
    let first_holder = first["holder"].as_str().unwrap().to_string();
    assert_eq!(lease_holder(&api, "prod/web").as_deref(), Some(first_holder.as_str()));

    // The delete: each poll reads /leader, then the Lease. Claiming stops
    // before the release: no poll sees 200 with the Lease released.
    api.delete(LEASES, "web");
    let mut polls = 0;
    let mut follower_seen = None;
    until("the Lease is released", Duration::from_secs(10), || {
        polls += 1;
        let claims = leading(http).is_some();
        let held = lease_holder(&api, "prod/web").is_some();
        assert!(
            held || !claims,
            "poll {polls}: /leader says leader with the Lease released"
        );
        if !claims && follower_seen.is_none() {
            follower_seen = Some(polls);
        }
        (!held).then_some(())
    });
    let stopped = follower_seen.expect("stopped claiming");
    println!("stopped claiming at poll {stopped}, released by poll {polls}");
    until("the pod marked retired-from u-1", Duration::from_secs(10), || {
        let pod = api.get(&pods::collection(NAMESPACE), "web-0")?;
        (pod["metadata"]["annotations"][RETIRED_FROM_ANNOTATION] == json!("u-1")).then_some(())
    });
    // Retired, waiting for a successor: still serving, as a follower.
    std::thread::sleep(Duration::from_secs(1));
    let (status, _) = get(http, "/leader").expect("a retired sidecar still answers");
    assert_eq!(status, 503);
    assert!(
        child.0.try_wait().unwrap().is_none(),
        "the process waits, it does not exit"
    );

    // Recreated on another lock: the same process re-executes and leads there.
    api.insert(LEASES, lease("u-2", "prod/web-moved"));
    let http = wait_for_ready_file("web-0 re-executed", &ready_file, &mut child.0)
        .http
        .port();
    let second = until(
        "the sidecar leads on lock prod/web-moved",
        Duration::from_secs(20),
        || leading(http),
    );
    let second_holder = second["holder"].as_str().unwrap().to_string();
    assert_ne!(second_holder, first_holder, "a fresh process run: a new identity");
    assert_eq!(
        lease_holder(&api, "prod/web-moved").as_deref(),
        Some(second_holder.as_str())
    );
    assert_eq!(lease_holder(&api, "prod/web"), None, "nothing claims the old lock");
    assert!(
        child.0.try_wait().unwrap().is_none(),
        "re-executed in place, not exited"
    );
    assert_eq!(child.0.id(), pid);
    assert!(api.forbidden().is_empty(), "{:?}", api.forbidden());

    drop(child);
    let _ = std::fs::remove_file(&kubeconfig);
}
