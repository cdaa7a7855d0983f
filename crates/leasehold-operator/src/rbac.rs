//! The Kubernetes permissions the operator uses, and nothing more.
//!
//! The wire-level tests check every request a reconcile makes against these
//! rules, and `docs/rbac-operator.md` carries them as a ClusterRole, so the
//! chart's RBAC cannot drift from the code silently.

pub use leasehold_kubernetes::rbac::{RequestAttributes, Rule};
pub use leasehold_kubernetes::rbac::{request_attributes, rules_yaml};

use super::election::DEFAULT_LEASE_NAME;

/// The injection webhook's MutatingWebhookConfiguration, as the chart names
/// it for a release called `leasehold` (and `--webhook-configuration`'s default).
pub const WEBHOOK_CONFIGURATION: &str = "leasehold-sidecar-injector";

pub const RULES: &[Rule] = &[
    // The controller's list+watch; finalizers by merge patch; the injection
    // webhook reads the lease a pod names.
    Rule {
        api_group: "leasehold.dev",
        resources: &["distributedleases"],
        verbs: &["get", "list", "watch", "patch"],
        resource_names: &[],
    },
    // Status by server-side apply.
    Rule {
        api_group: "leasehold.dev",
        resources: &["distributedleases/status"],
        verbs: &["patch"],
        resource_names: &[],
    },
    // Candidate counts and stale leader label repair.
    Rule {
        api_group: "",
        resources: &["pods"],
        verbs: &["list", "watch", "patch"],
        resource_names: &[],
    },
    // Preferred candidates: see whether a transfer of the lease is open,
    // and ask for one when a candidate outranks the leader
    // (operator::reconcile::prefer).
    Rule {
        api_group: "leasehold.dev",
        resources: &["leasetransfers"],
        verbs: &["list", "create"],
        resource_names: &[],
    },
    // The rollout check for readiness-gated leases, from one watch of the
    // Deployments (which lists first): no request per reconcile.
    Rule {
        api_group: "apps",
        resources: &["deployments"],
        verbs: &["list", "watch"],
        resource_names: &[],
    },
    // kube's event recorder creates events and patches repeats into series.
    Rule {
        api_group: "events.k8s.io",
        resources: &["events"],
        verbs: &["create", "patch"],
        resource_names: &[],
    },
    // The injection webhook's self-signed CA goes into its configuration.
    Rule {
        api_group: "admissionregistration.k8s.io",
        resources: &["mutatingwebhookconfigurations"],
        verbs: &["get", "patch"],
        resource_names: &[WEBHOOK_CONFIGURATION],
    },
];

/// Rules granted by a Role in the operator's own namespace only.
pub const NAMESPACED_RULES: &[Rule] = &[
    // The webhook certificate all replicas share (self-signed mode).
    Rule {
        api_group: "",
        resources: &["secrets"],
        verbs: &["get", "create"],
        resource_names: &[],
    },
    // Leader election on a coordination.k8s.io Lease (the default): create
    // it the first time (RBAC cannot limit create by name); list and watch
    // it (standbys follow the watch, which lists first), by a metadata.name
    // field selector; then
    // read and renew only the operator's own Lease.
    Rule {
        api_group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["create", "list", "watch"],
        resource_names: &[],
    },
    Rule {
        api_group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["get", "update"],
        resource_names: &[DEFAULT_LEASE_NAME],
    },
];

/// Rules granted by a Role in each candidates' namespace (the chart's
/// `sidecar.rbac.namespaces`): what the operator reads of the stores its
/// DistributedLeases there name, for status. Nothing it could write with.
pub const STORE_RULES: &[Rule] = &[
    // PostgreSQL and Redis: the store URL is in a Secret there, which the
    // operator reads to create the table and read the lease.
    Rule {
        api_group: "",
        resources: &["secrets"],
        verbs: &["get"],
        resource_names: &[],
    },
    // store.kubernetes: the locks' Leases, watched (one watch of the
    // namespace's Leases, which lists first) into status, and read (a
    // consistent get) before a delete completes. The sidecars create, renew
    // and release them; the operator never writes them (a dead holder's
    // Lease expires after D). RBAC cannot limit this by name: Lease names
    // come from the resources' locks.
    Rule {
        api_group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["get", "list", "watch"],
        resource_names: &[],
    },
];

/// Whether the operator's rules allow `request` (the stores' Role taken as
/// bound in the namespace asked about).
pub fn allows(request: &RequestAttributes) -> bool {
    [RULES, NAMESPACED_RULES, STORE_RULES]
        .iter()
        .any(|rules| leasehold_kubernetes::rbac::grants(rules, request))
}

/// Whether the operator's rules allow a request by method and path.
pub fn allows_request(method: &str, path: &str, watch: bool) -> bool {
    request_attributes(method, path, watch).is_some_and(|request| allows(&request))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = include_str!("../../../docs/rbac-operator.md");

    #[test]
    fn the_doc_carries_exactly_these_rules() {
        assert_eq!(
            leasehold_kubernetes::rbac::rules_lists_in(DOC),
            [rules_yaml(RULES), rules_yaml(NAMESPACED_RULES), rules_yaml(STORE_RULES)],
            "docs/rbac-operator.md must carry exactly the ClusterRole and Roles' rules, as rbac::rules_yaml() renders them"
        );
    }

    #[test]
    fn request_paths_map_to_group_resource_name_and_verb() {
        let cases = [
            ("GET", "/api/v1/namespaces/prod/pods", false, ("", "pods", None, "list")),
            (
                "PATCH",
                "/api/v1/namespaces/prod/pods/web-0",
                false,
                ("", "pods", Some("web-0"), "patch"),
            ),
            (
                "PATCH",
                "/apis/leasehold.dev/v1alpha1/namespaces/prod/distributedleases/web/status",
                false,
                ("leasehold.dev", "distributedleases/status", Some("web"), "patch"),
            ),
            (
                "GET",
                "/apis/leasehold.dev/v1alpha1/distributedleases",
                true,
                ("leasehold.dev", "distributedleases", None, "watch"),
            ),
            (
                "POST",
                "/apis/events.k8s.io/v1/namespaces/prod/events",
                false,
                ("events.k8s.io", "events", None, "create"),
            ),
            (
                "PUT",
                "/apis/coordination.k8s.io/v1/namespaces/leasehold-system/leases/leasehold-operator",
                false,
                ("coordination.k8s.io", "leases", Some("leasehold-operator"), "update"),
            ),
        ];
        for (method, path, watch, (group, resource, name, verb)) in cases {
            assert_eq!(
                request_attributes(method, path, watch),
                Some(RequestAttributes {
                    api_group: group.into(),
                    resource: resource.into(),
                    name: name.map(str::to_string),
                    verb,
                }),
                "{method} {path}"
            );
        }
        assert!(allows_request("PATCH", "/api/v1/namespaces/prod/pods/web-0", false));
        assert!(!allows_request("DELETE", "/api/v1/namespaces/prod/pods/web-0", false));
        // Readiness-gated leases read their Deployments from one watch
        // (list, then watch), never by a GET per reconcile.
        let deployments = "/apis/apps/v1/namespaces/prod/deployments";
        assert!(allows_request("GET", deployments, false) && allows_request("GET", deployments, true));
        assert!(!allows_request("GET", &format!("{deployments}/web"), false));
    }

    /// Whether the rules bound in the operator's own namespace (the
    /// ClusterRole's and its namespaced Role's) allow a request.
    fn allowed_in_own_namespace(method: &str, path: &str, watch: bool) -> bool {
        request_attributes(method, path, watch).is_some_and(|r| {
            leasehold_kubernetes::rbac::grants(RULES, &r) || leasehold_kubernetes::rbac::grants(NAMESPACED_RULES, &r)
        })
    }

    /// The same in a candidates' namespace (the ClusterRole's and the stores' Role's).
    fn allowed_in_candidates_namespace(method: &str, path: &str, watch: bool) -> bool {
        request_attributes(method, path, watch).is_some_and(|r| {
            leasehold_kubernetes::rbac::grants(RULES, &r) || leasehold_kubernetes::rbac::grants(STORE_RULES, &r)
        })
    }

    /// Named rules grant only the objects they name: the operator's own Lease
    /// and the chart's webhook configuration, nothing else of their kind. In
    /// the candidates' namespaces it may read Leases (the Kubernetes store's
    /// status) and nothing more: no write, list or watch.
    #[test]
    fn leases_and_webhook_configurations_are_limited_to_our_own() {
        let lease = "/apis/coordination.k8s.io/v1/namespaces/leasehold-system/leases";
        let own = allowed_in_own_namespace;
        assert!(own("GET", &format!("{lease}/{DEFAULT_LEASE_NAME}"), false));
        assert!(own("PUT", &format!("{lease}/{DEFAULT_LEASE_NAME}"), false));
        assert!(own("POST", lease, false), "create cannot be limited by name");
        assert!(!own("PUT", &format!("{lease}/kube-scheduler"), false));
        assert!(!own("GET", &format!("{lease}/kube-scheduler"), false));
        assert!(!own("DELETE", &format!("{lease}/{DEFAULT_LEASE_NAME}"), false));

        let leases = "/apis/coordination.k8s.io/v1/namespaces/prod/leases";
        let candidates = allowed_in_candidates_namespace;
        assert!(candidates("GET", &format!("{leases}/prod-scheduler-0a1b2c3d4e"), false));
        // The Kubernetes store's Leases are followed by one watch of the namespace.
        assert!(candidates("GET", leases, false), "list");
        assert!(candidates("GET", leases, true), "watch");
        for (method, path, watch) in [
            ("PUT", format!("{leases}/scheduler"), false),
            ("POST", leases.to_string(), false),
            ("DELETE", format!("{leases}/scheduler"), false),
            ("PATCH", format!("{leases}/scheduler"), false),
        ] {
            assert!(!candidates(method, &path, watch), "{method} {path} (watch: {watch})");
        }
        assert!(allows_request("GET", &format!("{leases}/scheduler"), false));

        let hooks = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations";
        assert!(allows_request(
            "GET",
            &format!("{hooks}/{WEBHOOK_CONFIGURATION}"),
            false
        ));
        assert!(allows_request(
            "PATCH",
            &format!("{hooks}/{WEBHOOK_CONFIGURATION}"),
            false
        ));
        assert!(!allows_request(
            "PATCH",
            &format!("{hooks}/istio-sidecar-injector"),
            false
        ));
        assert!(!allows_request("GET", hooks, false), "no list of every configuration");
    }

    /// One owner per name: the flags' defaults are the names the rules grant.
    #[test]
    fn the_named_objects_are_the_flag_defaults() {
        use clap::Parser as _;
        let cli = crate::tests::Cli::try_parse_from(["leasehold", "operator"]).unwrap();
        let crate::tests::Command::Operator(args) = cli.command;
        assert_eq!(args.webhook.webhook_configuration, WEBHOOK_CONFIGURATION);
        assert_eq!(args.election_lease_name, DEFAULT_LEASE_NAME);
    }
}
