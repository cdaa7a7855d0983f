//! The Kubernetes permissions the sidecar uses, and nothing more: a Role in
//! the candidates' namespace, bound to their ServiceAccount. The wire-level
//! tests check every request against these rules, and
//! `docs/rbac-sidecar.md` carries them.

use leasehold_kubernetes::rbac::Rule;

pub const RULES: &[Rule] = &[
    // Our own pod (readiness gates, re-read after a 409); candidates to clear
    // stale labels and to watch for a released leader; the leader label by
    // merge patch.
    Rule {
        api_group: "",
        resources: &["pods"],
        verbs: &["get", "list", "watch", "patch"],
        resource_names: &[],
    },
    // The readiness-gate condition: ours, and False on another candidate
    // still claiming when we lead.
    Rule {
        api_group: "",
        resources: &["pods/status"],
        verbs: &["patch"],
        resource_names: &[],
    },
    // Events on acquisition, loss and release (repeats are patched into a series).
    Rule {
        api_group: "events.k8s.io",
        resources: &["events"],
        verbs: &["create", "patch"],
        resource_names: &[],
    },
    // --lease: the DistributedLease that configures the sidecar, read at
    // start and watched for timing changes.
    Rule {
        api_group: "leasehold.dev",
        resources: &["distributedleases"],
        verbs: &["get", "list", "watch"],
        resource_names: &[],
    },
    // Transfers (issue 35): the leader watches the LeaseTransfers of its
    // namespace, acts on those naming its lease, and reports in their
    // status by server-side apply.
    Rule {
        api_group: "leasehold.dev",
        resources: &["leasetransfers"],
        verbs: &["get", "list", "watch"],
        resource_names: &[],
    },
    Rule {
        api_group: "leasehold.dev",
        resources: &["leasetransfers/status"],
        verbs: &["patch"],
        resource_names: &[],
    },
    // Versions (issue 16): the revision of a candidate's ReplicaSet, which
    // orders versions; read once per ReplicaSet.
    Rule {
        api_group: "apps",
        resources: &["replicasets"],
        verbs: &["get"],
        resource_names: &[],
    },
    LEASES,
];

/// store.kubernetes (`--store kubernetes`): the lock's Lease, read, listed
/// and watched by followers (a watch lists first), created without a
/// holder when absent and replaced by check-and-set. Never patched or
/// deleted. `leasehold check` reviews it for each candidate's account.
pub const LEASES: Rule = Rule {
    api_group: "coordination.k8s.io",
    resources: &["leases"],
    verbs: &["get", "list", "watch", "create", "update"],
    resource_names: &[],
};

/// Whether the sidecar's Role allows a request, for the wire-level tests.
pub fn allows_request(method: &str, path: &str, watch: bool) -> bool {
    leasehold_kubernetes::rbac::request_attributes(method, path, watch)
        .is_some_and(|request| leasehold_kubernetes::rbac::grants(RULES, &request))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_doc_carries_exactly_these_rules() {
        let doc = include_str!("../../../docs/rbac-sidecar.md");
        assert_eq!(
            leasehold_kubernetes::rbac::rules_lists_in(doc),
            [leasehold_kubernetes::rbac::rules_yaml(RULES)],
            "docs/rbac-sidecar.md must carry exactly the sidecar's rules"
        );
    }

    #[test]
    fn nothing_beyond_what_the_sidecar_calls() {
        assert!(allows_request(
            "PATCH",
            "/api/v1/namespaces/prod/pods/web-0/status",
            false
        ));
        assert!(allows_request("GET", "/api/v1/namespaces/prod/pods", true));
        assert!(!allows_request("DELETE", "/api/v1/namespaces/prod/pods/web-0", false));
        assert!(!allows_request(
            "PATCH",
            "/apis/leasehold.dev/v1alpha1/namespaces/prod/distributedleases/web",
            false
        ));
    }
}
