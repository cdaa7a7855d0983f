//! Issue 54 on a real cluster: an edited Secret must not elect a second
//! leader. The example's lease on PostgreSQL with three candidates and the
//! leadership watcher throughout; the lease records the identity of the
//! store it lives in (`status.storeIdentity`, written once by the operator)
//! and a sidecar campaigns only when the store its own URL reaches has that
//! identity.
//!
//! 1. The first leader: `status.storeIdentity` is there, `postgres:` and
//!    this server's system identifier; the holder's term is recorded.
//! 2. A second database `other` on the same server, the Secret's `url`
//!    edited to reach it, one follower deleted. Its replacement's sidecar
//!    runs with the edited URL mounted (read through the node's process
//!    table) and its `/healthz` answers 503 naming the mismatch; then, for
//!    [`MISMATCH_HELD_FOR`], it never claims, the status's holder stays a
//!    pod that was there before the edit and `storeIdentity` stays the
//!    same, and `StoreReady` shows only `True` (the operator has not read
//!    the Secret again: it does every 300 s or after a store failure) or
//!    `False`/`SecretPointsElsewhere`. The lock has no row in database
//!    `other`: a row is written only by an acquisition, so that is the proof
//!    that nobody campaigned on the store the edited Secret reaches.
//! 3. The Secret set back, the replacement deleted: the next one mounts the
//!    original URL, answers `/healthz` ok and follows; the leader deleted,
//!    a successor leads with a higher term, and the original store's row
//!    names its claim.
//! 4. A password rotation on the same database (`ALTER ROLE` of the URL's
//!    user, the Secret's URL with the new password), a follower deleted:
//!    its replacement mounts the new URL and answers `/healthz` ok, and once
//!    the leaders started before the rotation are deleted one of the pods
//!    started after it leads, with a higher term, on the same store. The
//!    fixture's server trusts the pods' network (`samenet trust`), so it
//!    does not refuse the old password: what this step shows is that a URL
//!    that differs only in its credentials reads the same identity.
//!
//! Throughout, the watcher fails the test on any moment with two claimants,
//! two leader labels or two leader endpoints, a status token going back,
//! and on any gap in its view. The lease is read as the API server returns
//! it (a dynamic object), so the fields are judged whatever the crate's own
//! status type knows of them.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject};
use leasehold::api::DistributedLease;
use leasehold::sidecar::publish::holder_pod;
use leasehold::store::DEFAULT_TABLE;
use leasehold::testing::servers::PostgresServer;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::e2e::cluster::{Scenario, scenario};
use crate::e2e::faults::converges;
use crate::e2e::fixtures::{APP, FIRST_LEADER, LEASE, SIDECAR, SUCCESSOR, delete_now, leader_only_service, ready_pods};
use crate::e2e::node::{container_main_pid, restarts};
use crate::e2e::stores::secret;
use crate::e2e::watcher::{Claim, LeadershipWatcher};

/// The fixture's database, which the lease's Secret names first.
const FIXTURE_DATABASE: &str = "postgres";
/// The second database on the same server, which the edited Secret names.
const OTHER_DATABASE: &str = "other";
/// The user of the fixture's URL (the server's superuser).
const URL_USER: &str = "leasehold";
/// The rotated password: letters and digits, so it goes into a URL as is.
const ROTATED_PASSWORD: &str = "rotated54x7";
/// Where the webhook mounts the lease's URL Secret key in the sidecar
/// (`LEASEHOLD_STORE_URL_FILE`).
const MOUNTED_URL: &str = "/var/run/leasehold-store/url";
/// The sidecar's metrics port, which also serves the `/healthz` of its
/// liveness probe, on the pod's address.
const SIDECAR_METRICS_PORT: u16 = 4041;
/// A new candidate pod scheduled and its sidecar running (the images are
/// on the node already).
const REPLACEMENT_RUNS: Duration = Duration::from_secs(120);
/// The operator records the identity at its first read of the store; the
/// candidates wait for it before they campaign, so it is there by the time
/// a leader is. A bound for a slow status write.
const IDENTITY_RECORDED: Duration = Duration::from_secs(30);
/// A sidecar's mounted URL, `/healthz` or row as expected: it reads both
/// identities at start; room for a liveness restart in between (three
/// failed probes, 10 s apart) and for the kubelet to start it again.
const SIDECAR_SETTLES: Duration = Duration::from_secs(90);
/// How long the candidate on the other store is watched not campaigning.
/// The lock is free there, so a candidate that campaigned would take it at
/// its first try (within P, 2 s); this is many times that, and long enough
/// for the kubelet to restart it once on its failing `/healthz`, which
/// reads the mounted Secret again.
const MISMATCH_HELD_FOR: Duration = Duration::from_secs(40);
/// How often the scenario's own waits and the held window look.
const POLL: Duration = Duration::from_millis(500);

/// Polls `probe` until it gives a value, or fails naming `what` and what
/// the probe saw instead the last time.
async fn wait_seeing<T, F, Fut>(what: &str, within: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let started = Instant::now();
    loop {
        let seen = match probe().await {
            Ok(value) => return value,
            Err(seen) => seen,
        };
        assert!(
            started.elapsed() < within,
            "{what}: not within {within:?}; last seen: {seen}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// The URL of `database` on the fixture's server as the pods reach it,
/// with `password` when given.
fn pod_url(s: &Scenario, server: &PostgresServer, password: Option<&str>, database: &str) -> String {
    let user = match password {
        Some(password) => format!("{URL_USER}:{password}"),
        None => URL_USER.to_string(),
    };
    let addr = SocketAddr::from((s.env.host_ip, server.port));
    format!("postgres://{user}@{addr}/{database}?sslmode=disable")
}

/// A connection to `database` as the server's administrator, on this
/// machine's loopback (trusted whatever the role's password).
async fn admin(server: &PostgresServer, database: &str) -> tokio_postgres::Client {
    let url = format!("postgres://{URL_USER}@{}/{database}?sslmode=disable", server.addr());
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to database {database} as its administrator: {e}"));
    tokio::spawn(connection);
    client
}

/// The server's system identifier, which its store identity names.
async fn system_identifier(server: &PostgresServer) -> String {
    let row = admin(server, FIXTURE_DATABASE)
        .await
        .query_one(
            "SELECT system_identifier::text FROM pg_catalog.pg_control_system()",
            &[],
        )
        .await
        .expect("reading the server's system identifier");
    row.get(0)
}

/// The rows (holder, term) of `lock` in `database`'s lease table; `None`
/// when the table does not exist there.
async fn lock_rows(server: &PostgresServer, database: &str, lock: &str) -> Option<Vec<(Option<String>, i64)>> {
    let client = admin(server, database).await;
    let exists = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_tables \
             WHERE schemaname = current_schema() AND tablename::text = $1)",
            &[&DEFAULT_TABLE],
        )
        .await
        .unwrap_or_else(|e| panic!("looking for table {DEFAULT_TABLE} in database {database}: {e}"));
    if !exists.get::<_, bool>(0) {
        return None;
    }
    let rows = client
        .query(
            &format!("SELECT holder, term FROM {DEFAULT_TABLE} WHERE name = $1"),
            &[&lock],
        )
        .await
        .unwrap_or_else(|e| panic!("reading {lock}'s rows in database {database}: {e}"));
    Some(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
}

/// Waits until the original store's row of `lock` names `claim` (its
/// holder and term).
async fn original_store_holds(server: &PostgresServer, lock: &str, claim: &Claim) {
    let what = format!(
        "the row of {lock} in database {FIXTURE_DATABASE} naming {} in term {}",
        claim.holder, claim.term
    );
    wait_seeing(&what, SIDECAR_SETTLES, || async {
        let rows = lock_rows(server, FIXTURE_DATABASE, lock).await;
        let holds = rows.as_deref().is_some_and(|rows| {
            rows.iter().any(|(holder, term)| {
                holder.as_deref() == Some(claim.holder.as_str()) && u64::try_from(*term) == Ok(claim.term)
            })
        });
        if holds { Ok(()) } else { Err(format!("rows {rows:?}")) }
    })
    .await;
}

/// What the API server holds of the lease's status.
#[derive(Debug)]
struct LeaseView {
    store_identity: Option<String>,
    holder: Option<String>,
    /// `StoreReady`'s status and reason, and its message.
    store_ready: Option<(String, String)>,
    store_ready_message: String,
}

/// The lease as the API server returns it.
async fn lease_view(s: &Scenario) -> Result<LeaseView, String> {
    let leases: Api<DynamicObject> =
        Api::namespaced_with(s.client.clone(), &s.ns, &ApiResource::erase::<DistributedLease>(&()));
    let lease = leases.get(LEASE).await.map_err(|e| format!("reading the lease: {e}"))?;
    let status = &lease.data["status"];
    let text = |value: &serde_json::Value| value.as_str().map(str::to_string);
    let conditions = status["conditions"].as_array().cloned().unwrap_or_default();
    let store_ready = conditions.iter().find(|c| c["type"] == "StoreReady");
    Ok(LeaseView {
        store_identity: text(&status["storeIdentity"]),
        holder: text(&status["holder"]),
        store_ready: store_ready.map(|c| {
            let status = text(&c["status"]).unwrap_or_default();
            (status, text(&c["reason"]).unwrap_or_default())
        }),
        store_ready_message: store_ready.and_then(|c| text(&c["message"])).unwrap_or_default(),
    })
}

/// The ID of `pod`'s sidecar container while it runs and the pod is not
/// being deleted.
fn running_sidecar(pod: &Pod) -> Option<String> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = pod.status.as_ref()?;
    let sidecar = (status.init_container_statuses.iter().flatten())
        .chain(status.container_statuses.iter().flatten())
        .find(|c| c.name == SIDECAR)?;
    sidecar.state.as_ref()?.running.as_ref()?;
    let id = sidecar.container_id.as_deref()?;
    Some(id.rsplit("://").next().unwrap_or(id).to_string())
}

/// Every candidate pod's name, terminating ones included.
async fn candidate_names(s: &Scenario) -> BTreeSet<String> {
    s.pods(APP).await.iter().map(|p| p.name_any()).collect()
}

/// The candidate pods whose sidecar runs and that are not being deleted.
async fn running_candidates(s: &Scenario) -> BTreeSet<String> {
    let pods = s.pods(APP).await;
    pods.iter()
        .filter(|p| running_sidecar(p).is_some())
        .map(|p| p.name_any())
        .collect()
}

/// A running candidate other than `leader`.
async fn running_follower(s: &Scenario, leader: &str) -> String {
    let running = running_candidates(s).await;
    running
        .iter()
        .find(|p| *p != leader)
        .cloned()
        .unwrap_or_else(|| panic!("a running follower besides {leader}; running: {running:?}"))
}

/// Waits until a candidate pod not among `before` runs its sidecar; returns it.
async fn replacement(s: &Scenario, before: &BTreeSet<String>, of: &str) -> String {
    let what = format!("the replacement of {of}: a new candidate pod whose sidecar runs");
    wait_seeing(&what, REPLACEMENT_RUNS, || async {
        let running = running_candidates(s).await;
        match running.iter().find(|p| !before.contains(*p)) {
            Some(new) => Ok(new.clone()),
            None => Err(format!("running candidates {running:?}, all there before")),
        }
    })
    .await
}

/// The URL mounted in `pod`'s running sidecar, read through the node's
/// process table (the image has no shell; the suite runs as root there).
async fn mounted_url(s: &Scenario, pod: &str) -> Result<String, String> {
    let pod = s
        .api::<Pod>()
        .get(pod)
        .await
        .map_err(|e| format!("reading the pod: {e}"))?;
    let container = running_sidecar(&pod).ok_or("its sidecar is not running")?;
    let pid = container_main_pid(&container).ok_or(format!("no process of container {container} in /proc"))?;
    let path = format!("/proc/{pid}/root{MOUNTED_URL}");
    std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))
}

/// Waits until `pod`'s sidecar has `url` mounted.
async fn mounts(s: &Scenario, pod: &str, url: &str, which: &str) {
    let what = format!("{pod}'s sidecar with {which} mounted ({url})");
    wait_seeing(&what, SIDECAR_SETTLES, || async {
        let mounted = mounted_url(s, pod).await?;
        if mounted.trim_end() == url {
            Ok(())
        } else {
            Err(format!("mounted {mounted:?}"))
        }
    })
    .await;
}

/// `GET /healthz` on `pod`'s sidecar: its status code and body, if it answered.
async fn healthz(s: &Scenario, pod: &str) -> Result<(u16, String), String> {
    let pod = s
        .api::<Pod>()
        .get(pod)
        .await
        .map_err(|e| format!("reading the pod: {e}"))?;
    let ip = (pod.status.and_then(|st| st.pod_ip)).ok_or("the pod has no address yet")?;
    let read = async {
        let mut stream = tokio::net::TcpStream::connect((ip.as_str(), SIDECAR_METRICS_PORT))
            .await
            .ok()?;
        stream
            .write_all(b"GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .await
            .ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        let code = head.split_whitespace().nth(1)?.parse().ok()?;
        Some((code, body.to_string()))
    };
    let answer = tokio::time::timeout(Duration::from_secs(2), read).await.ok().flatten();
    answer.ok_or_else(|| format!("no answer on {ip}:{SIDECAR_METRICS_PORT}/healthz"))
}

/// Waits until `pod`'s sidecar answers `/healthz` with 200: it reached the
/// store and found the lease's identity there.
async fn healthy(s: &Scenario, pod: &str) {
    let what = format!("{pod}'s sidecar answering /healthz with 200");
    wait_seeing(&what, SIDECAR_SETTLES, || async {
        match healthz(s, pod).await? {
            (200, _) => Ok(()),
            (code, body) => Err(format!("{code} {body:?}")),
        }
    })
    .await;
}

/// `pod` runs, is Ready and follows: not labelled leader, not claiming.
async fn follows(s: &Scenario, watcher: &LeadershipWatcher, pod: &str) {
    let what = format!("{pod} Ready and following");
    wait_seeing(&what, SIDECAR_SETTLES, || async {
        let ready = ready_pods(s).await;
        if !ready.iter().any(|p| p == pod) {
            return Err(format!("Ready pods {ready:?}"));
        }
        Ok(())
    })
    .await;
    assert!(
        !watcher.leaders().iter().any(|p| p == pod) && watcher.claim_of(pod).is_none(),
        "{pod} was to follow; labelled leader: {:?}, its claim: {:?}",
        watcher.leaders(),
        watcher.claim_of(pod)
    );
}

/// `status.storeIdentity` is still `pinned`.
async fn identity_kept(s: &Scenario, pinned: &str, when: &str) {
    let view = lease_view(s).await.unwrap_or_else(|e| panic!("{when}: {e}"));
    assert_eq!(
        view.store_identity.as_deref(),
        Some(pinned),
        "status.storeIdentity {when} (it is written once)"
    );
}

/// The `StoreReady` a lease may show while its Secret reaches another
/// store: still `True` (the operator has not read the Secret again) or
/// `False` naming that.
fn allowed_while_pointing_elsewhere(store_ready: &str) -> bool {
    store_ready.starts_with("True/") || store_ready == "False/SecretPointsElsewhere"
}

#[tokio::test]
async fn an_edited_secret_never_elects_a_second_leader() {
    scenario("e2e-store-identity", |s| async move {
        let (server, watcher) = leader_only_service(&s, json!({})).await;
        let lock = format!("{}/{LEASE}", s.ns);
        let original_url = pod_url(&s, &server, None, FIXTURE_DATABASE);
        assert_eq!(
            original_url,
            server.url_at((s.env.host_ip, server.port).into()),
            "the fixture's URL, as this scenario rebuilds it for other databases and passwords"
        );

        // 1. The first leader, and the identity of the store it leads on.
        let (first_leader, first_claim) = converges(&s, &watcher, None, FIRST_LEADER).await;
        let system = system_identifier(&server).await;
        let pinned = wait_seeing("status.storeIdentity recorded", IDENTITY_RECORDED, || async {
            let view = lease_view(&s).await?;
            view.store_identity
                .clone()
                .ok_or(format!("a status without it: {view:?}"))
        })
        .await;
        assert!(
            pinned.starts_with("postgres:") && pinned.contains(&system),
            "status.storeIdentity {pinned:?}: a PostgreSQL store naming this server's system identifier {system}"
        );
        println!("{first_leader} leads term {} on {pinned}", first_claim.term);

        // 2. The Secret edited to reach another database on the same server.
        admin(&server, FIXTURE_DATABASE)
            .await
            .batch_execute(&format!("CREATE DATABASE {OTHER_DATABASE}"))
            .await
            .expect("creating the other database");
        let other_url = pod_url(&s, &server, None, OTHER_DATABASE);
        let original = wait_seeing("three candidates whose sidecars run", REPLACEMENT_RUNS, || async {
            let running = running_candidates(&s).await;
            if running.len() == 3 {
                Ok(running)
            } else {
                Err(format!("running {running:?}"))
            }
        })
        .await;
        s.apply(vec![secret(&s, &other_url)]).await;
        let follower = running_follower(&s, &first_leader).await;
        let before = candidate_names(&s).await;
        delete_now(&s, &follower).await;
        let elsewhere = replacement(&s, &before, &follower).await;
        mounts(&s, &elsewhere, &other_url, "the edited URL").await;
        let other_identity = format!("postgres:{system}/{OTHER_DATABASE}");
        let what = format!("{elsewhere}'s /healthz answering 503 naming the mismatch ({pinned} or {other_identity})");
        let refusal = wait_seeing(&what, SIDECAR_SETTLES, || async {
            match healthz(&s, &elsewhere).await? {
                (503, body) if body.contains(&pinned) || body.contains(&other_identity) => Ok(body),
                (code, body) => Err(format!("{code} {body:?}")),
            }
        })
        .await;

        let mut store_ready_seen: Vec<String> = Vec::new();
        let held_from = Instant::now();
        while held_from.elapsed() < MISMATCH_HELD_FOR {
            let at = held_from.elapsed();
            let violations = watcher.violations();
            assert!(
                violations.is_empty(),
                "{at:?} into the held window, the watcher saw {violations:#?}"
            );
            assert!(
                !watcher.claimants().contains(&elsewhere),
                "{elsewhere}, whose URL reaches database {OTHER_DATABASE}, claimed on /leader ({at:?} into the \
                 held window): {:?}",
                watcher.claim_of(&elsewhere)
            );
            if let Ok(view) = lease_view(&s).await {
                assert_eq!(
                    view.store_identity.as_deref(),
                    Some(pinned.as_str()),
                    "status.storeIdentity {at:?} after the Secret was edited to reach database {OTHER_DATABASE}"
                );
                let holding = view.holder.as_deref().and_then(holder_pod);
                assert!(
                    holding.as_ref().is_some_and(|pod| original.contains(pod)),
                    "the status's holder {at:?} after the Secret was edited: {:?}, not one of the pods there \
                     before the edit {original:?}",
                    view.holder
                );
                let store_ready = match &view.store_ready {
                    Some((status, reason)) => format!("{status}/{reason}"),
                    None => "absent".to_string(),
                };
                if store_ready_seen.last() != Some(&store_ready) {
                    println!(
                        "StoreReady {store_ready} {at:?} into the held window: {}",
                        view.store_ready_message
                    );
                    store_ready_seen.push(store_ready);
                }
            }
            tokio::time::sleep(POLL).await;
        }
        assert!(
            store_ready_seen
                .iter()
                .all(|seen| allowed_while_pointing_elsewhere(seen)),
            "StoreReady while the Secret reached database {OTHER_DATABASE}: {store_ready_seen:?}; only True \
             (not read again yet) or False/SecretPointsElsewhere may show"
        );
        let rows = lock_rows(&server, OTHER_DATABASE, &lock).await;
        assert!(
            rows.as_ref().is_none_or(Vec::is_empty),
            "rows of {lock} in database {OTHER_DATABASE}: {rows:?}: a candidate acquired it on the store the \
             edited Secret reaches"
        );
        println!(
            "{elsewhere} on database {OTHER_DATABASE} for {MISMATCH_HELD_FOR:?}: /healthz {refusal:?}, sidecar \
             restarts {:?}, StoreReady {store_ready_seen:?}, its lease table there {}",
            restarts(&s, &elsewhere, SIDECAR).await,
            if rows.is_some() {
                "exists, without the lock"
            } else {
                "does not exist"
            }
        );

        // 3. The Secret set back: the next replacement follows, and a
        // successor of the leader leads on the original store.
        s.apply(vec![secret(&s, &original_url)]).await;
        let before = candidate_names(&s).await;
        delete_now(&s, &elsewhere).await;
        let back = replacement(&s, &before, &elsewhere).await;
        mounts(&s, &back, &original_url, "the original URL").await;
        healthy(&s, &back).await;
        follows(&s, &watcher, &back).await;
        let (leader, _) = converges(&s, &watcher, None, SUCCESSOR).await;
        delete_now(&s, &leader).await;
        let (successor, successor_claim) = converges(&s, &watcher, Some(&leader), SUCCESSOR).await;
        assert!(
            successor_claim.term > first_claim.term,
            "{successor}'s term {} after {leader} was deleted, not above the first leader's {}",
            successor_claim.term,
            first_claim.term
        );
        original_store_holds(&server, &lock, &successor_claim).await;
        identity_kept(&s, &pinned, "after the Secret was set back and the leader replaced").await;
        println!(
            "Secret set back: {back} follows; {leader} deleted, {successor} leads term {}",
            successor_claim.term
        );

        // 4. The password rotated on the same database.
        admin(&server, FIXTURE_DATABASE)
            .await
            .batch_execute(&format!("ALTER ROLE {URL_USER} WITH PASSWORD '{ROTATED_PASSWORD}'"))
            .await
            .expect("rotating the URL user's password");
        let rotated_url = pod_url(&s, &server, Some(ROTATED_PASSWORD), FIXTURE_DATABASE);
        s.apply(vec![secret(&s, &rotated_url)]).await;
        let before_rotation = candidate_names(&s).await;
        let follower = running_follower(&s, &successor).await;
        delete_now(&s, &follower).await;
        let rotated = replacement(&s, &before_rotation, &follower).await;
        mounts(&s, &rotated, &rotated_url, "the rotated URL").await;
        healthy(&s, &rotated).await;
        // Delete the leaders started before the rotation until one started
        // after it leads: each deleted leader's replacement is one too.
        let (mut leader, mut claim) = (successor, successor_claim);
        for _ in 0..before_rotation.len() {
            if !before_rotation.contains(&leader) {
                break;
            }
            delete_now(&s, &leader).await;
            let (next, next_claim) = converges(&s, &watcher, Some(&leader), SUCCESSOR).await;
            assert!(
                next_claim.term > claim.term,
                "{next}'s term {} after {leader} (term {}) was deleted",
                next_claim.term,
                claim.term
            );
            (leader, claim) = (next, next_claim);
        }
        assert!(
            !before_rotation.contains(&leader),
            "a pod started after the rotation leads; {leader} (started before it) still does"
        );
        mounts(&s, &leader, &rotated_url, "the rotated URL").await;
        original_store_holds(&server, &lock, &claim).await;
        identity_kept(&s, &pinned, "after the password rotation").await;
        println!(
            "password rotated: {rotated} started with the new URL; {leader} leads term {}",
            claim.term
        );

        let rows = lock_rows(&server, OTHER_DATABASE, &lock).await;
        assert!(
            rows.as_ref().is_none_or(Vec::is_empty),
            "rows of {lock} in database {OTHER_DATABASE} at the end: {rows:?}"
        );
        watcher.finish();
    })
    .await;
}
