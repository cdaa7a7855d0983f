//! The conformance suite on a real API server (the end-to-end cluster named
//! by LEASEHOLD_E2E_KUBECONFIG; without it these tests fail, saying how to
//! get one), each test in a namespace of its own; and the Kubernetes store's
//! own promises: tokens across deletion, re-creation and hand edits, expiry
//! by observed change whatever renewTime says, followers that read from the
//! watch, and the planted bug the suite must catch.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::support::cluster::{TestNamespace, config, with_unconditional_writes};
use async_trait::async_trait;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use leasehold::lease::{FencingToken, Grant, LeaseStore, StoreError};
use leasehold::store::kubernetes::{KubernetesStore, RECORD_ANNOTATION, lease_name};
use leasehold::testing::conformance::{StoreCall, Target};
use leasehold::testing::{ProxyMode, TcpProxy};

struct Cluster {
    namespace: TestNamespace,
    store: Arc<KubernetesStore>,
}

async fn cluster() -> Cluster {
    let namespace = TestNamespace::create("store").await;
    let store = Arc::new(KubernetesStore::new(namespace.client.clone(), Some(&namespace.name)));
    Cluster { namespace, store }
}

impl Cluster {
    /// Another process: a store of its own (its own view and clock start).
    fn another(&self) -> KubernetesStore {
        KubernetesStore::new(self.namespace.client.clone(), Some(&self.namespace.name))
    }

    fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.namespace.client.clone(), &self.namespace.name)
    }
}

#[async_trait]
impl Target for Cluster {
    fn store(&self) -> Arc<dyn LeaseStore> {
        self.store.clone()
    }

    /// `kubectl delete lease`.
    async fn delete_row(&self, lock: &str) {
        self.leases()
            .delete(&lease_name(lock), &DeleteParams::default())
            .await
            .unwrap();
    }

    /// The replace reaches the API server through a proxy that holds its
    /// reply back past the store's call timeout: it is applied, its reply is
    /// lost. The Lease exists (taken and released first when absent) and the
    /// store has read it, so the attempt is a write, not the read or list
    /// that precedes one.
    async fn with_lost_reply(
        &self,
        lock: &str,
        _holder: &str,
        _round_trips: u32,
        call: &StoreCall,
    ) -> Result<Grant, StoreError> {
        let mut config = config().await;
        let authority = config
            .cluster_url
            .authority()
            .expect("a cluster URL with a host")
            .clone();
        let server: SocketAddr = tokio::net::lookup_host(authority.as_str())
            .await
            .unwrap()
            .next()
            .expect("the API server resolves");
        let proxy = TcpProxy::start(server).await;
        config
            .tls_server_name
            .get_or_insert_with(|| authority.host().to_string());
        config.cluster_url = format!("https://{}", proxy.addr).parse().unwrap();
        let timeout = Duration::from_millis(500);
        let store = KubernetesStore::new(Client::try_from(config).unwrap(), Some(&self.namespace.name))
            .with_call_timeout(timeout);
        if store.observe(lock).await.unwrap().record.is_none() {
            let warm = store.acquire(lock, "warm-up", Duration::from_secs(30)).await.unwrap();
            store.release(lock, "warm-up", warm.token).await.unwrap();
        }
        proxy.set(ProxyMode::DelayReplies(timeout * 3));
        let result = call(Arc::new(store), lock.to_string()).await;
        proxy.set(ProxyMode::Forward);
        assert!(
            matches!(result, Err(StoreError::OutcomeUnknown { .. })),
            "a write whose reply was lost: {result:?}"
        );
        result
    }
}

leasehold::conformance_tests!(cluster());

/// The planted bug: a store that writes without the resourceVersion
/// precondition (last writer wins, as some Lease electors do) fails the
/// suite's race for a released lock.
#[tokio::test]
async fn the_suite_catches_writes_without_the_resource_version_precondition() {
    let cluster = cluster().await;
    let mutant = Arc::new(with_unconditional_writes(cluster.another()));
    let target = Cluster {
        store: mutant,
        namespace: cluster.namespace,
    };
    let run = tokio::spawn(async move { suite::racing_for_a_released_lock_one_wins(&target, 10).await });
    let outcome = run.await;
    assert!(
        outcome.as_ref().is_err_and(|e| e.is_panic()),
        "the mutant passed the race: {outcome:?}"
    );
}

fn token_of(lease: &Lease) -> i64 {
    let text = &lease.metadata.annotations.as_ref().unwrap()[RECORD_ANNOTATION];
    let record: serde_json::Value = serde_json::from_str(text).unwrap();
    record["token"].as_i64().unwrap()
}

/// Tokens strictly increase over hand edits of the record (its token set
/// far up, far down, the annotation removed) and over deleting the Lease
/// and creating it again by hand, held by a foreign holder: each next
/// acquisition is judged on a newer resourceVersion.
#[tokio::test]
async fn tokens_increase_across_hand_edits_deletion_and_re_creation() {
    let cluster = cluster().await;
    let (store, leases) = (cluster.store.clone(), cluster.leases());
    let lock = "team/edited";
    let name = lease_name(lock);
    let short = Duration::from_millis(200);
    let mut last = FencingToken(0);
    let mut take = async |holder: &str| {
        let grant = loop {
            match store.acquire(lock, holder, short).await {
                Ok(grant) => break grant,
                Err(StoreError::Lost { .. }) => tokio::time::sleep(short / 2).await,
                Err(e) => panic!("{holder}: {e:?}"),
            }
        };
        assert!(grant.token > last, "{holder}: token {} after {}", grant.token, last);
        last = grant.token;
        grant
    };
    // Each edit rewrites the record annotation (None: removes it).
    let edits: [(&str, Option<i64>); 3] = [
        ("token far up", Some(999_999_999_999_999)),
        ("token down to 1", Some(1)),
        ("record removed", None),
    ];
    let grant = take("a").await;
    store.release(lock, "a", grant.token).await.unwrap();
    for (what, edit) in edits {
        let mut lease = leases.get(&name).await.unwrap();
        let annotations = lease.metadata.annotations.as_mut().unwrap();
        match edit {
            Some(token) => {
                let mut record: serde_json::Value = serde_json::from_str(&annotations[RECORD_ANNOTATION]).unwrap();
                record["token"] = token.into();
                annotations.insert(RECORD_ANNOTATION.into(), record.to_string());
            }
            None => drop(annotations.remove(RECORD_ANNOTATION)),
        }
        leases.replace(&name, &PostParams::default(), &lease).await.unwrap();
        let grant = take(what).await;
        assert_eq!(token_of(&leases.get(&name).await.unwrap()), grant.token.0, "{what}");
        store.release(lock, what, grant.token).await.unwrap();
    }
    // Deleted, and created again by hand with a foreign holder and a
    // renewTime an hour in the future: taken once unchanged for its 1 s.
    leases.delete(&name, &DeleteParams::default()).await.unwrap();
    let hour = k8s_openapi::jiff::SignedDuration::from_hours(1);
    let foreign = Lease {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("client-go-candidate".into()),
            lease_duration_seconds: Some(1),
            renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now() + hour)),
            ..Default::default()
        }),
    };
    leases.create(&PostParams::default(), &foreign).await.unwrap();
    take("after re-creation").await;
}

/// Expiry is judged by when this process saw the record change, never by
/// renewTime: a holder whose renewTime is an hour old is still held when
/// first seen, and is taken only after it stayed unchanged for its lease
/// duration on this process's clock.
#[tokio::test]
async fn expiry_counts_from_the_observed_change_not_from_renew_time() {
    let cluster = cluster().await;
    let lock = "stale-renew-time";
    let hour = k8s_openapi::jiff::SignedDuration::from_hours(1);
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(lease_name(lock)),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("skewed-holder".into()),
            lease_duration_seconds: Some(2),
            renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now() - hour)),
            ..Default::default()
        }),
    };
    cluster.leases().create(&PostParams::default(), &lease).await.unwrap();
    let store = cluster.store.clone();
    let first = store.acquire(lock, "b", Duration::from_secs(2)).await;
    assert!(
        matches!(&first, Err(StoreError::Lost { reason, .. }) if reason.contains("skewed-holder")),
        "held when first seen, whatever its renewTime says: {first:?}"
    );
    let observed = store.observe(lock).await.unwrap();
    let remaining = observed.remaining().expect("held");
    assert!(
        remaining > Duration::from_secs(1),
        "counted from the sighting: {remaining:?}"
    );
    tokio::time::sleep(remaining).await;
    loop {
        match store.acquire(lock, "b", Duration::from_secs(2)).await {
            Ok(_) => break,
            Err(StoreError::Lost { .. }) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => panic!("{e:?}"),
        }
    }
}

/// A follower reads from the watch: once it follows, reading again sends
/// no request while the leader renews, and `changed` wakes it for the
/// leader's release.
#[tokio::test]
async fn followers_read_from_the_watch_and_wake_for_a_release() {
    let cluster = cluster().await;
    let (leader, follower) = (cluster.store.clone(), cluster.another());
    let lease = Duration::from_secs(30);
    let grant = leader.acquire("watched", "leader", lease).await.unwrap();
    let seen = follower.observe_followed("watched").await.unwrap();
    assert_eq!(seen.live_holder(), Some("leader"));
    // The watch delivers each renewal; wait for it to show the last one.
    let sent = follower.requests();
    for _ in 0..3 {
        let before = follower.observe_followed("watched").await.unwrap();
        leader.renew("watched", "leader", grant.token, lease).await.unwrap();
        follower.changed("watched", &before).await;
        let after = follower.observe_followed("watched").await.unwrap();
        assert_ne!(after.record, before.record, "the renewal was seen");
    }
    assert_eq!(follower.requests(), sent, "no request while following a held lease");
    let before = follower.observe_followed("watched").await.unwrap();
    leader.release("watched", "leader", grant.token).await.unwrap();
    follower.changed("watched", &before).await;
    let after = follower.observe_followed("watched").await.unwrap();
    assert_eq!(after.live_holder(), None, "the release was seen: {after:?}");
    follower.acquire("watched", "follower", lease).await.unwrap();
}

/// The operator's view of a namespace (issue 39): one watch of its Leases
/// answers `observe_many` for every lock without a request per lock, with
/// the holders, terms and tokens a consistent read gives, and
/// `changed_any` wakes for a release.
#[tokio::test]
async fn the_operator_observes_every_lease_of_a_namespace_from_one_watch() {
    let cluster = cluster().await;
    let lease = Duration::from_secs(30);
    let locks: Vec<String> = (0..20).map(|i| format!("many-{i}")).collect();
    let mut grants = Vec::new();
    for (i, lock) in locks.iter().enumerate().take(10) {
        grants.push(
            cluster
                .store
                .acquire(lock, &format!("holder-{i}"), lease)
                .await
                .unwrap(),
        );
    }
    let operator =
        KubernetesStore::new(cluster.namespace.client.clone(), Some(&cluster.namespace.name)).watching_namespace();
    let shown = |observed: &[leasehold::lease::Observation]| -> Vec<_> {
        observed
            .iter()
            .map(|o| {
                let record = o.record.as_ref();
                (
                    o.live_holder().map(str::to_string),
                    record.map(|r| r.term),
                    record.and_then(|r| r.token),
                )
            })
            .collect()
    };
    let watched = operator.observe_many(&locks).await.unwrap();
    let read = cluster.another().observe_many(&locks).await.unwrap();
    assert_eq!(
        shown(&watched),
        shown(&read),
        "the watch shows what a consistent read does"
    );
    assert_eq!(shown(&watched)[3].0.as_deref(), Some("holder-3"));
    assert_eq!(shown(&watched)[13], (None, None, None), "a lock never taken");
    operator.observe_many(&locks).await.unwrap();
    assert_eq!(operator.requests(), 0, "no request per lock, at first or later");

    let mut woken = std::pin::pin!(operator.changed_any());
    tokio::select! {
        biased;
        () = &mut woken => panic!("woken before anything changed"),
        () = std::future::ready(()) => {}
    }
    cluster
        .store
        .release(&locks[0], "holder-0", grants[0].token)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(30), woken)
        .await
        .expect("changed_any wakes for the release");
    let after = operator.observe_many(&locks[..1]).await.unwrap();
    assert_eq!(after[0].live_holder(), None, "the release is seen: {after:?}");
    assert_eq!(operator.requests(), 0);
}

/// The sidecar's Role (crates/leasehold-sidecar/src/rbac.rs, the chart's rbac-sidecar.yaml)
/// is enough for the store: a client impersonating a ServiceAccount bound
/// to exactly those rules creates, watches, renews, releases and takes the
/// Lease over; a forbidden call would fail as `Invalid`, naming the verbs.
#[tokio::test]
async fn the_sidecar_role_allows_everything_the_store_does() {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
    let cluster = cluster().await;
    let (client, namespace) = (cluster.namespace.client.clone(), cluster.namespace.name.clone());
    let post = PostParams::default();
    let named = |name: &str| ObjectMeta {
        name: Some(name.into()),
        namespace: Some(namespace.clone()),
        ..Default::default()
    };
    let account = ServiceAccount {
        metadata: named("candidate"),
        ..Default::default()
    };
    Api::<ServiceAccount>::namespaced(client.clone(), &namespace)
        .create(&post, &account)
        .await
        .unwrap();
    let rules = leasehold::sidecar::rbac::RULES
        .iter()
        .map(|rule| PolicyRule {
            api_groups: Some(vec![rule.api_group.into()]),
            resources: Some(rule.resources.iter().map(|r| r.to_string()).collect()),
            verbs: rule.verbs.iter().map(|v| v.to_string()).collect(),
            resource_names: (!rule.resource_names.is_empty())
                .then(|| rule.resource_names.iter().map(|n| n.to_string()).collect()),
            ..Default::default()
        })
        .collect();
    let role = Role {
        metadata: named("sidecar"),
        rules: Some(rules),
    };
    Api::<Role>::namespaced(client.clone(), &namespace)
        .create(&post, &role)
        .await
        .unwrap();
    let binding = RoleBinding {
        metadata: named("sidecar"),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: "sidecar".into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: "candidate".into(),
            namespace: Some(namespace.clone()),
            ..Default::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(client.clone(), &namespace)
        .create(&post, &binding)
        .await
        .unwrap();
    let mut config = config().await;
    config.auth_info.impersonate = Some(format!("system:serviceaccount:{namespace}:candidate"));
    let candidate = |config: kube::Config| KubernetesStore::new(Client::try_from(config).unwrap(), Some(&namespace));
    let (leader, follower) = (candidate(config.clone()), candidate(config));
    let lease = Duration::from_secs(30);
    // A forbidden call is `Invalid` naming the verbs; the first store call
    // may race the RoleBinding's propagation to the authorizer.
    let grant = loop {
        match leader.acquire("prod/web", "leader", lease).await {
            Ok(grant) => break grant,
            Err(StoreError::Invalid { context, .. }) if context.contains("forbidden") => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("{e:?}"),
        }
    };
    let seen = follower.observe_followed("prod/web").await.unwrap();
    leader.renew("prod/web", "leader", grant.token, lease).await.unwrap();
    follower.changed("prod/web", &seen).await;
    let seen = follower.observe_followed("prod/web").await.unwrap();
    leader.release("prod/web", "leader", grant.token).await.unwrap();
    follower.changed("prod/web", &seen).await;
    follower.acquire("prod/web", "follower", lease).await.unwrap();
}
